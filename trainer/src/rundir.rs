//! Run directories: the exclusive lock a run holds for its whole life, recognition (and
//! refusal) of an existing run, removal of what an interrupted checkpoint left behind, and
//! atomic replacement of small files.
//!
//! * [`RunLock::acquire`] takes an exclusive advisory lock (`flock`) on `DIR/.lock` and writes
//!   the holder (process id, host, command line) into it; a second process gets
//!   [`RunDirError::Locked`] naming the holder. The lock is released when the [`RunLock`] is
//!   dropped or the process ends (also on `kill -9`).
//! * [`existing_run_files`] lists the files that make a directory a run directory
//!   ([`RUN_FILES`]); [`remove_run_files`] deletes exactly those (`--overwrite`).
//! * [`remove_leftovers`] deletes `checkpoints/.tmp-step-*` directories and
//!   `checkpoints/.latest.tmp` that a killed or failed checkpoint write left;
//!   [`remove_atomic_leftovers`] the `.NAME.tmp` files of a killed [`write_atomic`].
//! * [`write_atomic`] writes a file through a temporary name, fsync and rename, so a reader
//!   (or a crash) sees the old or the new content, never a truncated file.
//! * [`StagedDir`] builds a whole output directory (an export, a tokenized corpus) in a hidden
//!   sibling and renames it onto the output only when complete, so the output is either absent
//!   or whole.

use std::fs;
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

/// The lock file in a run directory.
pub const LOCK_FILE: &str = ".lock";

/// The entries that make a directory a run directory.
pub const RUN_FILES: &[&str] = &[
    "run.toml",
    "recipe.toml",
    "metrics.jsonl",
    "summary.json",
    "diagnosis.txt",
    "checkpoints",
    "tokenizer.json",
];

/// Why a run directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// File-system error.
    #[error("{path}: {message}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// Another process holds the run directory's lock.
    #[error(
        "{dir} is in use by another process ({holder}); wait for it to finish or stop it first"
    )]
    Locked {
        /// The run directory.
        dir: PathBuf,
        /// What the holder wrote into the lock file (process id, host, command line).
        holder: String,
    },
    /// A new run was asked to write into a directory that holds another run.
    #[error("{dir} already holds a run ({found}); continue it with `trainer train --resume {dir}`, or pass --overwrite to delete it and start over")]
    Exists {
        /// The run directory.
        dir: PathBuf,
        /// The run files found (comma-separated).
        found: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |e| RunDirError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// An exclusive lock on a run directory, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    _file: fs::File,
    dir: PathBuf,
}

impl RunLock {
    /// Creates `dir` if needed and locks it (non-blocking): [`RunDirError::Locked`] when
    /// another process holds the lock.
    pub fn acquire(dir: &Path) -> Result<RunLock, RunDirError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOCK_FILE);
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        if !try_lock_exclusive(&file).map_err(io(&path))? {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(RunDirError::Locked {
                dir: dir.to_path_buf(),
                holder: if holder.is_empty() {
                    "holder unknown".into()
                } else {
                    holder.replace('\n', "; ")
                },
            });
        }
        let info = format!(
            "pid {} on {}, started {}: {}\n",
            std::process::id(),
            hostname(),
            unix_time(),
            std::env::args().collect::<Vec<_>>().join(" ")
        );
        file.set_len(0).map_err(io(&path))?;
        file.rewind().map_err(io(&path))?;
        file.write_all(info.as_bytes()).map_err(io(&path))?;
        Ok(RunLock {
            _file: file,
            dir: dir.to_path_buf(),
        })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "this host".into())
}

#[cfg(unix)]
fn try_lock_exclusive(file: &fs::File) -> std::io::Result<bool> {
    use std::os::unix::io::AsRawFd as _;
    loop {
        // SAFETY: flock on a file descriptor this function borrows; no memory is passed.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

#[cfg(not(unix))]
fn try_lock_exclusive(_file: &fs::File) -> std::io::Result<bool> {
    // No advisory locks here: the run directory is not protected against a second process.
    Ok(true)
}

/// The [`RUN_FILES`] present in `dir`.
pub fn existing_run_files(dir: &Path) -> Vec<&'static str> {
    RUN_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).symlink_metadata().is_ok())
        .collect()
}

/// Refuses a directory that holds a run ([`RunDirError::Exists`]) unless `overwrite`, in
/// which case exactly its [`RUN_FILES`] are deleted (other files stay).
pub fn prepare_fresh(dir: &Path, overwrite: bool) -> Result<(), RunDirError> {
    let found = existing_run_files(dir);
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        return Err(RunDirError::Exists {
            dir: dir.to_path_buf(),
            found: found.join(", "),
        });
    }
    remove_run_files(dir)
}

/// Deletes the [`RUN_FILES`] of `dir`.
pub fn remove_run_files(dir: &Path) -> Result<(), RunDirError> {
    for f in RUN_FILES {
        let p = dir.join(f);
        match p.symlink_metadata() {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&p).map_err(io(&p))?,
            Ok(_) => fs::remove_file(&p).map_err(io(&p))?,
            Err(_) => {}
        }
    }
    Ok(())
}

/// Deletes what an interrupted or failed checkpoint write left in `checkpoints`
/// (`.tmp-step-*` directories, `.latest.tmp`). Returns the names removed.
pub fn remove_leftovers(checkpoints: &Path) -> Result<Vec<String>, RunDirError> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(checkpoints) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(io(checkpoints)(e)),
    };
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let p = entry.path();
        if name.starts_with(".tmp-step-") {
            fs::remove_dir_all(&p).map_err(io(&p))?;
        } else if name == ".latest.tmp" {
            fs::remove_file(&p).map_err(io(&p))?;
        } else {
            continue;
        }
        removed.push(name);
    }
    removed.sort();
    Ok(removed)
}

/// Deletes the temporary files [`write_atomic`] leaves when it is killed (`.NAME.tmp`
/// beside the run's files and `report.md` in `dir`). Returns the names removed.
pub fn remove_atomic_leftovers(dir: &Path) -> Result<Vec<String>, RunDirError> {
    let mut removed = Vec::new();
    for name in RUN_FILES.iter().chain(&["report.md"]) {
        let tmp = format!(".{name}.tmp");
        let p = dir.join(&tmp);
        if p.symlink_metadata().is_ok_and(|m| m.is_file()) {
            fs::remove_file(&p).map_err(io(&p))?;
            removed.push(tmp);
        }
    }
    Ok(removed)
}

/// Replaces `path` with `bytes` atomically: write `.NAME.tmp` beside it, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_with_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let a = RunLock::acquire(tmp.path()).unwrap();
        let e = RunLock::acquire(tmp.path()).unwrap_err();
        match &e {
            RunDirError::Locked { holder, .. } => {
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{e}"
                )
            }
            other => panic!("{other}"),
        }
        drop(a);
        RunLock::acquire(tmp.path()).unwrap();
    }

    #[test]
    fn existing_runs_are_refused_unless_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        prepare_fresh(tmp.path(), false).unwrap();
        fs::write(tmp.path().join("notes.txt"), "mine").unwrap();
        prepare_fresh(tmp.path(), false).unwrap();
        fs::create_dir_all(tmp.path().join("checkpoints/step-00000001")).unwrap();
        fs::write(tmp.path().join("metrics.jsonl"), "{}\n").unwrap();
        let e = prepare_fresh(tmp.path(), false).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl, checkpoints"), "{e}");
        assert!(e.contains("--resume") && e.contains("--overwrite"), "{e}");
        prepare_fresh(tmp.path(), true).unwrap();
        assert!(existing_run_files(tmp.path()).is_empty());
        assert!(tmp.path().join("notes.txt").is_file());
    }

    #[test]
    fn leftovers_are_removed_and_atomic_writes_replace() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("checkpoints");
        assert!(remove_leftovers(&ck).unwrap().is_empty());
        fs::create_dir_all(ck.join(".tmp-step-00000004")).unwrap();
        fs::write(ck.join(".tmp-step-00000004/model.safetensors"), b"x").unwrap();
        fs::write(ck.join(".latest.tmp"), b"step-").unwrap();
        fs::create_dir_all(ck.join("step-00000002")).unwrap();
        assert_eq!(
            remove_leftovers(&ck).unwrap(),
            [".latest.tmp", ".tmp-step-00000004"]
        );
        assert!(ck.join("step-00000002").is_dir());
        let p = tmp.path().join("run.toml");
        fs::write(tmp.path().join(".run.toml.tmp"), b"a = ").unwrap();
        fs::write(tmp.path().join(".metrics.jsonl.tmp"), b"{").unwrap();
        assert_eq!(
            remove_atomic_leftovers(tmp.path()).unwrap(),
            [".run.toml.tmp", ".metrics.jsonl.tmp"]
        );
        write_atomic(&p, b"a = 1\n").unwrap();
        write_atomic(&p, b"a = 2\n").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "a = 2\n");
        assert!(!tmp.path().join(".run.toml.tmp").exists());
    }
}

/// Why a staged output directory could not be set up or committed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The output exists and is not an empty directory.
    #[error("{}: the output exists and is not empty; refusing to overwrite (choose a new directory)", .0.display())]
    OutputExists(PathBuf),
    /// The output path has no final component (e.g. `/` or `..`).
    #[error("{}: not a directory name", .0.display())]
    BadPath(PathBuf),
    /// File-system error.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

fn stage_io(path: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
    move |error| StageError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// An output directory built in a hidden sibling `.NAME.TAG-PID` and renamed onto `NAME` by
/// [`StagedDir::commit`]; dropped before that (an error, a panic), the sibling is removed.
/// Siblings left by killed processes (whose `Drop` never ran) are removed when the next
/// `StagedDir` for the same output and tag is created.
///
/// ```
/// # let base = std::env::temp_dir().join(format!("staged-doc-{}", std::process::id()));
/// let out = base.join("export");
/// let staged = trainer::rundir::StagedDir::new(&out, "export")?;
/// std::fs::write(staged.path().join("config.json"), "{}")?;
/// assert!(!out.exists()); // nothing visible until the commit
/// staged.commit()?;
/// assert!(out.join("config.json").exists());
/// # std::fs::remove_dir_all(&base)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StagedDir {
    tmp: PathBuf,
    out: PathBuf,
    done: bool,
}

impl StagedDir {
    /// Whether `out` can be a staged output: absent or an empty directory, and a path with a
    /// final component. Creates nothing: commands that work long before they write (training
    /// a tokenizer) check their output with it first.
    ///
    /// ```
    /// use trainer::rundir::{StageError, StagedDir};
    /// let here = std::env::current_dir()?;
    /// assert!(matches!(StagedDir::check_output(&here), Err(StageError::OutputExists(_))));
    /// assert!(StagedDir::check_output(&here.join("no-such-output-dir")).is_ok());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn check_output(out: &Path) -> Result<(), StageError> {
        if out.exists()
            && !(out.is_dir() && fs::read_dir(out).map_err(stage_io(out))?.next().is_none())
        {
            return Err(StageError::OutputExists(out.to_path_buf()));
        }
        if out.file_name().is_none() {
            return Err(StageError::BadPath(out.to_path_buf()));
        }
        Ok(())
    }

    /// Creates the hidden sibling of `out` (which must pass [`StagedDir::check_output`]).
    pub fn new(out: &Path, tag: &str) -> Result<StagedDir, StageError> {
        Self::check_output(out)?;
        let name = out
            .file_name()
            .ok_or_else(|| StageError::BadPath(out.to_path_buf()))?
            .to_string_lossy()
            .into_owned();
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(stage_io(&parent))?;
        remove_stale_staging(&parent, &format!(".{name}.{tag}-"))?;
        let tmp = parent.join(format!(".{name}.{tag}-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(stage_io(&tmp))?;
        }
        // the output is what the user named: a failure here is a failure to create it
        fs::create_dir(&tmp).map_err(stage_io(out))?;
        Ok(StagedDir {
            tmp,
            out: out.to_path_buf(),
            done: false,
        })
    }

    /// The directory to write into.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Renames the staged directory onto the output.
    pub fn commit(mut self) -> Result<(), StageError> {
        if self.out.is_dir() {
            fs::remove_dir(&self.out).map_err(stage_io(&self.out))?;
        }
        fs::rename(&self.tmp, &self.out).map_err(stage_io(&self.out))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Removes the staging directories `PREFIX<pid>` in `parent` of processes that no longer run.
fn remove_stale_staging(parent: &Path, prefix: &str) -> Result<(), StageError> {
    let entries = fs::read_dir(parent).map_err(stage_io(parent))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let p = e.path();
            fs::remove_dir_all(&p).map_err(stage_io(&p))?;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn process_alive(_pid: u32) -> bool {
    true // unknown: keep it
}
