//! Generated files that are committed (`golden`, `ptx`): generating them into a scratch
//! directory, then comparing them with the committed copy (`--check`) or replacing it.

use anyhow::Result;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The names of the generated files found in a directory (empty when it does not exist).
pub type Names = fn(&Path) -> Result<BTreeSet<String>>;

/// Runs `f` on a fresh, empty temporary directory `nibble-<tag>-<pid>` and removes it
/// afterwards, whatever `f` returned.
pub fn in_temp_dir(tag: &str, f: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("nibble-{tag}-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp)?;
    let result = f(&tmp);
    fs::remove_dir_all(&tmp).ok();
    result
}

/// Compares the fresh files with the committed ones; returns one line per missing, extra
/// (`producer` names what should have made it) or differing file, and the fresh file count.
pub fn differences(
    names: Names,
    fresh: &Path,
    committed: &Path,
    producer: &str,
) -> Result<(Vec<String>, usize)> {
    let (new, old) = (names(fresh)?, names(committed)?);
    let mut problems = Vec::new();
    for name in new.union(&old) {
        match (new.contains(name), old.contains(name)) {
            (true, false) => problems.push(format!("missing: {name}")),
            (false, true) => problems.push(format!("not produced by the {producer}: {name}")),
            _ => {
                if fs::read(fresh.join(name))? != fs::read(committed.join(name))? {
                    problems.push(format!("differs: {name}"));
                }
            }
        }
    }
    Ok((problems, new.len()))
}

/// Replaces the committed files with the fresh ones.
pub fn install(names: Names, fresh: &Path, committed: &Path) -> Result<()> {
    fs::create_dir_all(committed)?;
    let (new, old) = (names(fresh)?, names(committed)?);
    for name in old.difference(&new) {
        println!("removing stale {name}");
        fs::remove_file(committed.join(name))?;
    }
    for name in &new {
        fs::copy(fresh.join(name), committed.join(name))?;
    }
    println!("wrote {} files to {}", new.len(), committed.display());
    Ok(())
}
