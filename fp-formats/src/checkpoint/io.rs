//! Memory-mapped safetensors input and a positional safetensors writer.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::CheckpointError;

/// One tensor of an input file.
#[derive(Clone, Debug)]
pub(crate) struct InTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub range: Range<usize>,
}

/// A memory-mapped safetensors file whose header was validated by the `safetensors` crate
/// (header length checked against 100 MB and the file size before it is read, offsets
/// contiguous and covering the data exactly, sizes consistent with shapes and dtypes).
pub(crate) struct InputFile {
    pub path: PathBuf,
    mmap: Mmap,
    /// Tensors sorted by name.
    pub tensors: Vec<InTensor>,
    pub metadata: BTreeMap<String, String>,
}

impl InputFile {
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let file = File::open(path).map_err(CheckpointError::io(path))?;
        let len = file.metadata().map_err(CheckpointError::io(path))?.len();
        if len < 8 {
            return Err(CheckpointError::Truncated {
                path: path.into(),
                len,
            });
        }
        // SAFETY: the map is read-only; like every memory-mapped reader it assumes the file
        // is not truncated by another process while it is being read.
        let mmap = unsafe { Mmap::map(&file) }.map_err(CheckpointError::io(path))?;
        let (n, meta) =
            SafeTensors::read_metadata(&mmap).map_err(|error| CheckpointError::Corrupt {
                path: path.into(),
                error,
            })?;
        let start = 8 + n;
        let mut tensors: Vec<InTensor> = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| InTensor {
                name,
                dtype: info.dtype,
                shape: info.shape.clone(),
                range: start + info.data_offsets.0..start + info.data_offsets.1,
            })
            .collect();
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let metadata = meta
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        Ok(InputFile {
            path: path.into(),
            mmap,
            tensors,
            metadata,
        })
    }

    pub fn bytes(&self, t: &InTensor) -> &[u8] {
        &self.mmap[t.range.clone()]
    }

    pub fn get(&self, name: &str) -> Option<&InTensor> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i])
    }

    pub fn len(&self) -> u64 {
        self.mmap.len() as u64
    }
}

/// Widens F32 / BF16 / F16 little-endian bytes to f32 (exact).
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> bool {
    out.clear();
    match dtype {
        Dtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        Dtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)),
        ),
        Dtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        ),
        _ => return false,
    }
    true
}

/// The safetensors name of a dtype.
pub(crate) fn dtype_name(d: Dtype) -> String {
    serde_json::to_value(d)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{d:?}"))
}

/// A tensor to be written.
#[derive(Clone, Debug)]
pub(crate) struct OutTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl OutTensor {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>) -> Self {
        OutTensor {
            name: name.into(),
            dtype,
            shape,
        }
    }
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Writes a safetensors file whose header (names, dtypes, shapes, offsets) is fixed up front,
/// so tensors can be written in any order from any thread.
pub(crate) struct Writer {
    path: PathBuf,
    file: Mutex<File>,
    slots: BTreeMap<String, (u64, usize)>,
    pending: Mutex<usize>,
}

impl Writer {
    pub fn create(
        path: &Path,
        tensors: &[OutTensor],
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, CheckpointError> {
        let mut sorted: Vec<&OutTensor> = tensors.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert(
                "__metadata__".into(),
                serde_json::to_value(metadata).expect("string map"),
            );
        }
        let mut offset = 0usize;
        let mut rel = Vec::with_capacity(sorted.len());
        for t in &sorted {
            let n = t.nbytes();
            header.insert(
                t.name.clone(),
                serde_json::json!({
                    "dtype": dtype_name(t.dtype),
                    "shape": t.shape,
                    "data_offsets": [offset, offset + n],
                }),
            );
            rel.push((t.name.clone(), offset, n));
            offset += n;
        }
        let mut json = serde_json::to_vec(&header).expect("JSON header");
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let data_start = 8 + json.len() as u64;
        let mut file = File::create(path).map_err(CheckpointError::io(path))?;
        let io = CheckpointError::io(path);
        (|| {
            file.write_all(&(json.len() as u64).to_le_bytes())?;
            file.write_all(&json)?;
            file.set_len(data_start + offset as u64)
        })()
        .map_err(io)?;
        let slots = rel
            .into_iter()
            .map(|(name, off, n)| (name, (data_start + off as u64, n)))
            .collect::<BTreeMap<_, _>>();
        let pending = slots.len();
        Ok(Writer {
            path: path.into(),
            file: Mutex::new(file),
            slots,
            pending: Mutex::new(pending),
        })
    }

    /// Writes the bytes of tensor `name` (exactly its size).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let &(off, n) = self.slots.get(name).expect("tensor planned in the header");
        assert_eq!(bytes.len(), n, "size of tensor {name}");
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.seek(SeekFrom::Start(off))
            .and_then(|_| f.write_all(bytes))
            .map_err(CheckpointError::io(&self.path))?;
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        Ok(())
    }

    /// Flushes the file to disk; every planned tensor must have been written.
    pub fn finish(self) -> Result<(), CheckpointError> {
        let pending = *self.pending.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            pending,
            0,
            "tensors left unwritten in {}",
            self.path.display()
        );
        let f = self.file.into_inner().unwrap_or_else(|e| e.into_inner());
        f.sync_all().map_err(CheckpointError::io(&self.path))
    }
}
