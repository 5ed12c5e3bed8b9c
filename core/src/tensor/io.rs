//! safetensors files: read every tensor by name, write tensors (contiguous copies).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use half::{bf16, f16};
use safetensors::tensor::{Dtype as StDtype, TensorView};

use memmap2::Mmap;

use super::{Buf, HostTensor, Storage};
use crate::error::{Error, ErrorKind, Result};

fn st_dtype(s: &Storage) -> StDtype {
    match s {
        Storage::F32(_) => StDtype::F32,
        Storage::F16(_) => StDtype::F16,
        Storage::BF16(_) => StDtype::BF16,
        Storage::Fp8E4M3(_) => StDtype::F8_E4M3,
        Storage::Fp8E5M2(_) => StDtype::F8_E5M2,
        Storage::I8(_) => StDtype::I8,
        Storage::I32(_) => StDtype::I32,
        Storage::I64(_) => StDtype::I64,
        Storage::Bool(_) => StDtype::BOOL,
    }
}

fn to_bytes(s: &Storage) -> Vec<u8> {
    match s {
        Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.to_vec(),
        Storage::I8(v) => v.iter().map(|&x| x as u8).collect(),
        Storage::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Bool(v) => v.iter().map(|&x| u8::from(x)).collect(),
    }
}

fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

fn from_view(name: &str, origin: &str, v: &TensorView<'_>) -> Result<HostTensor> {
    let b = v.data();
    let storage = match v.dtype() {
        StDtype::F32 => Storage::F32(chunks::<4>(b).map(f32::from_le_bytes).collect()),
        StDtype::F16 => Storage::F16(chunks::<2>(b).map(f16::from_le_bytes).collect()),
        StDtype::BF16 => Storage::BF16(chunks::<2>(b).map(bf16::from_le_bytes).collect()),
        StDtype::F8_E4M3 => Storage::Fp8E4M3(b.to_vec().into()),
        StDtype::F8_E5M2 => Storage::Fp8E5M2(b.to_vec().into()),
        StDtype::I8 => Storage::I8(b.iter().map(|&x| x as i8).collect()),
        StDtype::I32 => Storage::I32(chunks::<4>(b).map(i32::from_le_bytes).collect()),
        StDtype::I64 => Storage::I64(chunks::<8>(b).map(i64::from_le_bytes).collect()),
        StDtype::BOOL => Storage::Bool(b.iter().map(|&x| x != 0).collect()),
        other => {
            return Err(Error::invalid(format!(
                "{origin}: tensor `{name}` has dtype {other:?}, which LayerZero does not read (f32 f16 bf16 f8_e4m3 f8_e5m2 i8 i32 i64 bool)"
            )));
        }
    };
    HostTensor::new(storage, v.shape()).map_err(|e| Error::invalid(format!("{origin}: tensor `{name}`: {e}")))
}

/// The error for bytes the safetensors reader refused, naming the tensor and the field at
/// fault when the header says which (the reader's own message does not).
fn not_safetensors(bytes: &[u8], origin: &str, e: &safetensors::SafeTensorError) -> Error {
    match header_fault(bytes) {
        Some(fault) => Error::invalid(format!("{origin}: not a safetensors file: {fault}")),
        None => Error::invalid(format!("{origin}: not a safetensors file: {e}")),
    }
}

/// The first tensor whose header entry is inconsistent: an unknown dtype, or `data_offsets`
/// that do not span `shape` x the dtype's size or run past the data.
fn header_fault(bytes: &[u8]) -> Option<String> {
    let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Value = serde_json::from_slice(bytes.get(8..8usize.checked_add(len)?)?).ok()?;
    let data = bytes.len() - 8 - len;
    for (name, entry) in header.as_object()?.iter().filter(|(n, _)| *n != "__metadata__") {
        let dtype = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let size: u64 = match dtype {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "F8_E4M3" | "F8_E5M2" | "I8" | "U8" | "BOOL" => 1,
            other => return Some(format!("tensor `{name}`: field `dtype` is {other:?}, not a safetensors dtype")),
        };
        let shape: Option<Vec<u64>> =
            entry.get("shape").and_then(|s| s.as_array()).map(|a| a.iter().filter_map(|d| d.as_u64()).collect());
        let offsets: Option<Vec<u64>> =
            entry.get("data_offsets").and_then(|s| s.as_array()).map(|a| a.iter().filter_map(|d| d.as_u64()).collect());
        let (Some(shape), Some(offsets)) = (shape, offsets) else {
            return Some(format!("tensor `{name}`: fields `shape` and `data_offsets` must be arrays of integers"));
        };
        let [start, end] = offsets[..] else {
            return Some(format!("tensor `{name}`: field `data_offsets` must hold two integers"));
        };
        let need = shape.iter().try_fold(size, |acc, &d| acc.checked_mul(d));
        if end < start || need != Some(end - start) {
            return Some(format!(
                "tensor `{name}`: field `data_offsets` [{start}, {end}] spans {} bytes; shape {shape:?} of {dtype} needs {}",
                end.saturating_sub(start),
                need.map_or("more than 2^64".to_owned(), |n| n.to_string())
            ));
        }
        if end > data as u64 {
            return Some(format!("tensor `{name}`: field `data_offsets` ends at {end}, past the {data} bytes of data"));
        }
    }
    None
}

/// Parses safetensors bytes.
pub fn parse(bytes: &[u8], origin: &str) -> Result<BTreeMap<String, HostTensor>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| not_safetensors(bytes, origin, &e))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        out.insert(name.clone(), from_view(&name, origin, &view)?);
    }
    Ok(out)
}

/// `v`'s elements in place in `map` (at byte `off`), when its dtype can be read there and
/// the data starts on the element's alignment; `None` otherwise (the caller copies).
fn mapped_storage(v: &TensorView<'_>, map: &Arc<Mmap>, off: usize) -> Option<Storage> {
    let n: usize = v.shape().iter().product();
    Some(match v.dtype() {
        StDtype::F32 => Storage::F32(Buf::mapped(map, off, n)?),
        StDtype::F16 => Storage::F16(Buf::mapped(map, off, n)?),
        StDtype::BF16 => Storage::BF16(Buf::mapped(map, off, n)?),
        StDtype::F8_E4M3 => Storage::Fp8E4M3(Buf::mapped(map, off, n)?),
        StDtype::F8_E5M2 => Storage::Fp8E5M2(Buf::mapped(map, off, n)?),
        StDtype::I8 => Storage::I8(Buf::mapped(map, off, n)?),
        StDtype::I32 => Storage::I32(Buf::mapped(map, off, n)?),
        StDtype::I64 => Storage::I64(Buf::mapped(map, off, n)?),
        _ => return None,
    })
}

/// Maps a safetensors file and returns its tensors, read in place where their bytes are
/// aligned for their dtype (copied otherwise): loading a model does not copy its weights,
/// and the pages are read from the page cache as the kernels touch them.
pub fn read_mapped(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    read_mapped_with(path, true)
}

/// [`read_mapped`], with the pages faulted in at once (`populate`, for tensors served from the
/// map) or as they are read (tensors copied out piece by piece, whose pieces are released as
/// they go: populating them all first would hold the whole file at once).
pub fn read_mapped_with(path: &Path, populate: bool) -> Result<BTreeMap<String, HostTensor>> {
    let origin = path.display().to_string();
    let io_err = |e: std::io::Error| Error::new(ErrorKind::Io, format!("cannot read {origin}: {e}")).with_source(e);
    crate::files::check_regular(path)?;
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut options = memmap2::MmapOptions::new();
    if populate {
        options.populate();
    }
    #[allow(unsafe_code)]
    // SAFETY: the map is read-only and this process never writes the file. Another process
    // that truncates or rewrites a model file while it is served breaks the map's contents
    // (as it does for every loader that maps weights: HF safetensors, candle, llama.cpp); the
    // loader accepts that, as the whole point of mapping is not to copy gigabytes of weights.
    // Populated (`populate`): the pages are faulted in here, at load, rather than one by one
    // inside the first forward pass (measured on the 125M model: the first prefill ran 2x
    // slower).
    let map = Arc::new(unsafe { options.map(&file) }.map_err(io_err)?);
    let st = safetensors::SafeTensors::deserialize(&map).map_err(|e| not_safetensors(&map, &origin, &e))?;
    let base = map.as_ptr() as usize;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        // The view's bytes lie inside the map (safetensors checked the offsets).
        let off = view.data().as_ptr() as usize - base;
        let t = match mapped_storage(&view, &map, off) {
            Some(storage) => HostTensor::new(storage, view.shape())
                .map_err(|e| Error::invalid(format!("{origin}: tensor `{name}`: {e}")))?,
            None => from_view(&name, &origin, &view)?,
        };
        out.insert(name, t);
    }
    Ok(out)
}

/// Reads every tensor of a safetensors file (mapped: a dump or reference of any size is read
/// without copying it whole into memory).
pub fn read(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    read_mapped(path)
}

/// safetensors bytes of the given tensors (each written contiguous).
pub fn serialize(tensors: &BTreeMap<String, HostTensor>) -> Result<Vec<u8>> {
    let owned: Vec<(String, HostTensor, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let c = t.contiguous();
            let bytes = to_bytes(c.storage());
            (n.clone(), c, bytes)
        })
        .collect();
    let mut views = Vec::with_capacity(owned.len());
    for (name, t, bytes) in &owned {
        let v = TensorView::new(st_dtype(t.storage()), t.shape().to_vec(), bytes)
            .map_err(|e| Error::invalid(format!("tensor `{name}`: {e}")))?;
        views.push((name.clone(), v));
    }
    safetensors::serialize(views, None).map_err(|e| Error::invalid(format!("cannot serialize tensors: {e}")))
}

/// Writes tensors to a safetensors file (through an exclusive temporary renamed over it, so
/// a failed write never leaves a half-written file under the final name).
pub fn write(path: &Path, tensors: &BTreeMap<String, HostTensor>) -> Result<()> {
    write_output(path, tensors, &[])
}

/// [`write`], refusing when `path` is one of `inputs` (the files the run read) and when it
/// names anything but a regular file (see [`crate::files::write`]).
pub fn write_output(path: &Path, tensors: &BTreeMap<String, HostTensor>, inputs: &[&Path]) -> Result<()> {
    let bytes = serialize(tensors)?;
    crate::files::write(path, &bytes, inputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::dtype::DType;

    #[test]
    fn every_dtype_round_trips_through_safetensors() -> TestResult {
        let values = [0.5f32, -1.25, 3.0, 448.0, -0.0, 7.0];
        let mut m = BTreeMap::new();
        for d in DType::ALL {
            let t = HostTensor::from_f32_as(d, &[2, 3], &values)?;
            m.insert(d.as_str().to_owned(), t);
        }
        let back = parse(&serialize(&m)?, "test")?;
        for (name, t) in &m {
            let b = &back[name];
            assert_eq!(b.dtype(), t.dtype());
            assert_eq!(b.shape(), t.shape());
            assert_eq!(b.to_f64_vec(), t.to_f64_vec(), "{name}");
        }
        Ok(())
    }

    #[test]
    fn a_permuted_view_is_written_in_logical_order() -> TestResult {
        let t = HostTensor::from_f32(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0])?;
        let p = t.permute(&[1, 0])?;
        let mut m = BTreeMap::new();
        m.insert("p".to_owned(), p);
        let back = parse(&serialize(&m)?, "test")?;
        assert_eq!(back["p"].shape(), &[3, 2]);
        assert_eq!(back["p"].to_f32_vec(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        Ok(())
    }

    #[test]
    fn an_inconsistent_header_entry_is_named_with_its_field() -> TestResult {
        let header = br#"{"w":{"dtype":"F32","shape":[48,64],"data_offsets":[0,4000]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend(std::iter::repeat_n(0u8, 4000));
        let err = parse(&bytes, "x.safetensors").err().ok_or("an inconsistent header must be refused")?.to_string();
        assert!(err.contains("tensor `w`") && err.contains("data_offsets") && err.contains("12288"), "{err}");
        Ok(())
    }

    #[test]
    fn garbage_is_a_clear_error() -> TestResult {
        let err = parse(b"not a file", "x.safetensors").err().ok_or("garbage must be refused")?.to_string();
        assert!(err.contains("x.safetensors") && err.contains("not a safetensors file"), "{err}");
        Ok(())
    }

    #[test]
    fn a_mapped_file_is_read_in_place_and_written_by_copy() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("w.safetensors");
        let values = [0.5f32, -1.25, 3.0, 448.0, -0.0, 7.0];
        let mut m = BTreeMap::new();
        for d in DType::ALL {
            let t = HostTensor::from_f32_as(d, &[2, 3], &values)?;
            m.insert(d.as_str().to_owned(), t);
        }
        write(&path, &m)?;
        let mut back = read_mapped(&path)?;
        for (name, t) in &m {
            let b = &back[name];
            assert_eq!(b.to_f64_vec(), t.to_f64_vec(), "{name}");
            // Every dtype but bool (not a plain byte pattern) is read in place.
            assert_eq!(b.storage().is_mapped(), t.dtype() != DType::Bool, "{name}");
        }
        let mut w = back.remove("f32").map(HostTensor::into_shared).ok_or("no f32")?;
        let Some(Storage::F32(buf)) = Arc::get_mut(&mut w) else { return Err("the f32 tensor is shared".into()) };
        buf[0] = 9.0;
        assert!(!buf.is_mapped(), "writing copies the mapped elements");
        assert_eq!(buf[..2], [9.0, -1.25]);
        // The file is untouched.
        assert_eq!(read_mapped(&path)?["f32"].to_f32_vec(), values);
        Ok(())
    }

    #[test]
    fn misaligned_or_out_of_range_bytes_are_not_mapped() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("b.bin");
        std::fs::write(&path, [0u8; 64])?;
        let file = std::fs::File::open(&path)?;
        #[allow(unsafe_code)]
        // SAFETY: a private temporary file nothing else writes.
        let map = Arc::new(unsafe { Mmap::map(&file) }?);
        assert!(Buf::<f32>::mapped(&map, 4, 15).is_some());
        assert!(Buf::<f32>::mapped(&map, 2, 4).is_none(), "f32 at byte 2 is misaligned");
        assert!(Buf::<f32>::mapped(&map, 8, 15).is_none(), "15 floats from byte 8 pass the end");
        assert!(Buf::<f32>::mapped(&map, usize::MAX, 1).is_none());
        Ok(())
    }

    #[test]
    fn a_truncated_mapped_file_is_a_clear_error() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.safetensors");
        let mut m = BTreeMap::new();
        m.insert("x".to_owned(), HostTensor::from_f32(&[4], vec![1.0; 4])?);
        let bytes = serialize(&m)?;
        std::fs::write(&path, &bytes[..bytes.len() - 3])?;
        let err = read_mapped(&path).err().ok_or("a truncated file must be refused")?.to_string();
        assert!(err.contains("t.safetensors") && err.contains("not a safetensors file"), "{err}");
        std::fs::write(&path, b"")?;
        assert!(read_mapped(&path).is_err(), "an empty file is refused");
        Ok(())
    }

    /// File-backed resident memory of this process (`RssFile` of /proc/self/status), bytes.
    #[cfg(target_os = "linux")]
    fn rss_file() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("RssFile:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_tensor_copied_resident_gives_its_mapped_pages_back() -> TestResult {
        const MB: u64 = 1 << 20;
        let n = 16 << 20; // 64 MiB of f32
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("big.safetensors");
        let values: Vec<f32> = (0..n).map(|i| (i % 251) as f32).collect();
        let m = BTreeMap::from([("w".to_owned(), HostTensor::from_f32(&[n], values)?)]);
        std::fs::write(&path, serialize(&m)?)?;
        drop(m);
        let read = read_mapped_with(&path, true)?;
        let t = read.get("w").ok_or("no tensor w")?;
        assert!(t.storage().is_mapped());
        let before = rss_file().ok_or("no RssFile")?;
        let copy = HostTensor::new(t.storage().resident(), &[n])?;
        let after = rss_file().ok_or("no RssFile")?;
        // The 64 MiB the populated map held are released as they are copied (other tests
        // of this process may map files meanwhile: a margin of 16 MiB).
        assert!(before >= after + 48 * MB, "RssFile {} MiB before the copy, {} MiB after", before / MB, after / MB);
        assert_eq!(copy.numel(), n);
        assert_eq!(copy.to_f32_vec()[..300], t.to_f32_vec()[..300], "the copy holds the values");
        // The released pages read the same values again (from the unchanged file).
        assert_eq!(t.to_f32_vec()[(n - 5)..], copy.to_f32_vec()[(n - 5)..]);
        Ok(())
    }
}
