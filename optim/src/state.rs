//! The byte format of saved optimizer state.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"NIBOPTST"
//!      8     4  format version (u32, currently 1)
//!     12     4  optimizer kind (u32: 1 = AdamW, 2 = SGD)
//!     16     8  payload length in bytes (u64)
//!     24     n  payload (kind-specific, see AdamW / Sgd)
//!   24+n     4  CRC-32 (IEEE, as zlib.crc32) of bytes [0, 24+n)
//! ```
//!
//! All integers and floats are little-endian; f32 values are stored as their bit patterns, so a
//! round trip is bit-exact (NaN payloads included). Every payload starts with the groups and the
//! parameter layout:
//!
//! ```text
//! u32 n_groups, then per group: f32 weight_decay, f32 lr_scale
//! u64 n_params, then per param: u64 len, u32 group
//! ```
//!
//! Loading checks, in order: length, magic, version, exact total length, checksum, kind, then parses
//! the payload with every length validated against the bytes that remain (a corrupt length cannot
//! trigger a huge allocation), and requires the payload to be consumed exactly.

use crate::error::StateError;
use crate::group::{ParamGroup, ParamSpec};

pub(crate) const MAGIC: [u8; 8] = *b"NIBOPTST";
pub(crate) const VERSION: u32 = 1;
pub(crate) const KIND_ADAMW: u32 = 1;
pub(crate) const KIND_SGD: u32 = 2;
const HEADER: usize = 24;
const TRAILER: usize = 4;

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of zlib and PNG. Slicing-by-8.
///
/// ```
/// assert_eq!(optim::crc32(b"123456789"), 0xCBF4_3926);
/// ```
pub fn crc32(data: &[u8]) -> u32 {
    let t = &CRC_TABLES;
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ crc;
        let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        crc = t[0][((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

static CRC_TABLES: [[u32; 256]; 8] = crc_tables();

const fn crc_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

/// Builds a state: header placeholder, payload, then `finish` patches the length and appends the CRC.
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new(kind: u32, payload_hint: usize) -> Self {
        let mut buf = Vec::with_capacity(HEADER + payload_hint + TRAILER);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&kind.to_le_bytes());
        buf.extend_from_slice(&0u64.to_le_bytes());
        Self { buf }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub fn f32s(&mut self, v: &[f32]) {
        self.buf.reserve(v.len() * 4);
        for x in v {
            self.buf.extend_from_slice(&x.to_bits().to_le_bytes());
        }
    }
    pub fn layout(&mut self, groups: &[ParamGroup], specs: &[ParamSpec]) {
        self.u32(groups.len() as u32);
        for g in groups {
            self.f32(g.weight_decay);
            self.f32(g.lr_scale);
        }
        self.u64(specs.len() as u64);
        for s in specs {
            self.u64(s.len as u64);
            self.u32(s.group as u32);
        }
    }
    pub fn finish(mut self) -> Vec<u8> {
        let payload_len = (self.buf.len() - HEADER) as u64;
        self.buf[16..24].copy_from_slice(&payload_len.to_le_bytes());
        let crc = crc32(&self.buf);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf
    }
}

/// Validates the envelope and returns a reader over the payload.
pub(crate) fn open<'a>(
    bytes: &'a [u8],
    kind: u32,
    kind_name: &'static str,
) -> Result<Reader<'a>, StateError> {
    let available = bytes.len() as u64;
    if bytes.len() < 16 {
        return Err(StateError::Truncated {
            needed: 16,
            available,
        });
    }
    if bytes[..8] != MAGIC {
        return Err(StateError::BadMagic);
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Err(StateError::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    if bytes.len() < HEADER + TRAILER {
        return Err(StateError::Truncated {
            needed: (HEADER + TRAILER) as u64,
            available,
        });
    }
    let found_kind = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let payload_len = u64::from_le_bytes(len);
    let needed = payload_len
        .checked_add((HEADER + TRAILER) as u64)
        .ok_or(StateError::Malformed("payload length overflows"))?;
    if available < needed {
        return Err(StateError::Truncated { needed, available });
    }
    if available > needed {
        return Err(StateError::TrailingBytes {
            extra: available - needed,
        });
    }
    let body_end = bytes.len() - TRAILER;
    let t = &bytes[body_end..];
    let stored = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    let computed = crc32(&bytes[..body_end]);
    if stored != computed {
        return Err(StateError::ChecksumMismatch { stored, computed });
    }
    if found_kind != kind {
        return Err(StateError::WrongKind {
            expected: kind_name,
            found: found_kind,
        });
    }
    Ok(Reader {
        data: &bytes[HEADER..body_end],
        pos: 0,
    })
}

/// Bounds-checked little-endian reader over a payload.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], StateError> {
        if n > self.remaining() {
            return Err(StateError::Malformed("payload shorter than its contents"));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, StateError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, StateError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, StateError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub fn f32(&mut self) -> Result<f32, StateError> {
        Ok(f32::from_bits(self.u32()?))
    }
    /// Reads `n` f32 values; `n` is checked against the remaining bytes before allocating.
    pub fn f32s(&mut self, n: usize) -> Result<Vec<f32>, StateError> {
        let bytes = n
            .checked_mul(4)
            .ok_or(StateError::Malformed("element count overflows"))?;
        let b = self.take(bytes)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect())
    }
    pub fn bool(&mut self) -> Result<bool, StateError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(StateError::Malformed("boolean flag is neither 0 nor 1")),
        }
    }
    /// Reads groups and parameter specs; validates group ids and that the total size is plausible
    /// for the bytes left (`bytes_per_element` bytes of state follow per element).
    pub fn layout(
        &mut self,
        bytes_per_element: usize,
    ) -> Result<(Vec<ParamGroup>, Vec<ParamSpec>), StateError> {
        let n_groups = self.u32()? as usize;
        if n_groups == 0 || n_groups > self.remaining() / 8 {
            return Err(StateError::Malformed("implausible group count"));
        }
        let mut groups = Vec::with_capacity(n_groups);
        for _ in 0..n_groups {
            let weight_decay = self.f32()?;
            let lr_scale = self.f32()?;
            groups.push(ParamGroup {
                weight_decay,
                lr_scale,
            });
        }
        let n_params = usize::try_from(self.u64()?)
            .map_err(|_| StateError::Malformed("implausible parameter count"))?;
        if n_params > self.remaining() / 12 {
            return Err(StateError::Malformed("implausible parameter count"));
        }
        let mut specs = Vec::with_capacity(n_params);
        let mut total: u64 = 0;
        for _ in 0..n_params {
            let len = self.u64()?;
            let group = self.u32()? as usize;
            if group >= n_groups {
                return Err(StateError::Malformed("parameter refers to a missing group"));
            }
            total = total
                .checked_add(len)
                .ok_or(StateError::Malformed("total element count overflows"))?;
            let len = usize::try_from(len)
                .map_err(|_| StateError::Malformed("parameter length exceeds usize"))?;
            specs.push(ParamSpec { len, group });
        }
        let state_bytes = total
            .checked_mul(bytes_per_element as u64)
            .ok_or(StateError::Malformed("total element count overflows"))?;
        if state_bytes > self.remaining() as u64 {
            return Err(StateError::Malformed(
                "layout describes more state than the payload holds",
            ));
        }
        Ok((groups, specs))
    }
    pub fn finish(self) -> Result<(), StateError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(StateError::Malformed("payload has unread bytes"))
        }
    }
}

/// Describes the first difference between two layouts, or `None` if they are equal.
pub(crate) fn layout_diff(mine: &[ParamSpec], saved: &[ParamSpec]) -> Option<String> {
    if mine.len() != saved.len() {
        return Some(format!(
            "optimizer has {} parameters, state has {}",
            mine.len(),
            saved.len()
        ));
    }
    mine.iter()
        .zip(saved)
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| {
            format!(
                "parameter {i}: optimizer has len {} in group {}, state has len {} in group {}",
                a.len, a.group, b.len, b.group
            )
        })
}

/// Compares groups bit for bit (so that -0.0 vs 0.0 or NaN payloads count as different).
pub(crate) fn groups_diff(mine: &[ParamGroup], saved: &[ParamGroup]) -> Option<String> {
    let same = mine.len() == saved.len()
        && mine.iter().zip(saved).all(|(a, b)| {
            a.weight_decay.to_bits() == b.weight_decay.to_bits()
                && a.lr_scale.to_bits() == b.lr_scale.to_bits()
        });
    (!same).then(|| format!("optimizer groups {mine:?}, state groups {saved:?}"))
}
