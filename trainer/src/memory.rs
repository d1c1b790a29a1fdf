//! Memory estimates checked before allocating: every size that comes from a user (model
//! shape, batch, corpus bytes, tokens to sample) is turned into an estimate of the bytes it
//! needs, and [`check`] refuses what cannot fit with [`TooLarge`], whose message carries the
//! estimate, instead of letting an allocation abort the process.

use std::fmt;

/// Used when the available memory cannot be read (no `/proc/meminfo`).
pub const FALLBACK_AVAILABLE: u64 = 1 << 40;

/// A request that does not fit in memory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} needs about {} of memory ({needed} bytes estimated), more than the {} available", Bytes(*needed), Bytes(*available))]
pub struct TooLarge {
    /// What was asked for.
    pub what: String,
    /// The estimate in bytes (saturated at `u64::MAX`).
    pub needed: u64,
    /// The memory available to this process in bytes.
    pub available: u64,
}

/// Bytes in binary units (`1.5 GiB`).
#[derive(Clone, Copy, Debug)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn cgroup_available() -> Option<u64> {
    let max = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" (no limit) does not parse
    let current: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.current")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    Some(max.saturating_sub(current))
}

/// Memory this process can still allocate: the smaller of `MemAvailable` and the cgroup's
/// remaining limit, or [`FALLBACK_AVAILABLE`] when neither can be read.
pub fn available() -> u64 {
    match (meminfo_available(), cgroup_available()) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => FALLBACK_AVAILABLE,
    }
}

/// Refuses `needed` bytes for `what` when they exceed [`available`].
pub fn check(what: &str, needed: u128) -> Result<(), TooLarge> {
    check_against(what, needed, available())
}

/// [`check`] against a given amount of available memory.
pub fn check_against(what: &str, needed: u128, available: u64) -> Result<(), TooLarge> {
    if needed > available as u128 {
        return Err(TooLarge {
            what: what.to_string(),
            needed: u64::try_from(needed).unwrap_or(u64::MAX),
            available,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_the_estimate() {
        check_against("x", 10, 10).unwrap();
        let e = check_against("a corpus of 99 bytes", 3 << 30, 1 << 30).unwrap_err();
        assert_eq!(e.needed, 3 << 30);
        assert_eq!(
            e.to_string(),
            "a corpus of 99 bytes needs about 3.0 GiB of memory (3221225472 bytes estimated), more than the 1.0 GiB available"
        );
        let e = check_against("x", u128::MAX, 1).unwrap_err();
        assert_eq!(e.needed, u64::MAX);
        assert!(available() > 0);
        assert_eq!(Bytes(512).to_string(), "512 B");
    }
}
