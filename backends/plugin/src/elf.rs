//! A shared library's ELF headers, read before it is handed to the dynamic loader: `dlopen` of
//! a truncated file maps segments past its end, and the first touch of them kills the process
//! with SIGBUS. Every segment and table the loader maps must lie inside the file.

/// Why `bytes` cannot be a loadable shared library for this machine, if it cannot.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(format!("not an ELF file ({} bytes, no ELF header)", bytes.len()));
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |at: usize| bytes.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |at: usize| bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let header = |v: Option<u64>| v.ok_or_else(|| "truncated ELF header".to_owned());
    let e_type = header(u16_at(16).map(u64::from))?;
    if e_type != 3 {
        return Err(format!("ELF type {e_type} is not a shared object (3)"));
    }
    let machine = header(u16_at(18).map(u64::from))?;
    if let Some(expected) = MACHINE
        && machine != expected
    {
        return Err(format!("built for ELF machine {machine}; this machine is {expected}"));
    }
    let len = bytes.len() as u64;
    let within = |off: u64, size: u64| off.checked_add(size).is_some_and(|end| end <= len);
    let (phoff, phentsize, phnum) =
        (header(u64_at(32))?, header(u16_at(54).map(u64::from))?, header(u16_at(56).map(u64::from))?);
    if phentsize < 56 || !within(phoff, phentsize * phnum) {
        return Err(format!(
            "its program header table ({phnum} entries at {phoff}) runs past the end of the file ({len} bytes): truncated?"
        ));
    }
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize).map_err(|_| "program header offset too large".to_owned())?;
        let p_type = header(bytes.get(at..at + 4).map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))))?;
        let (offset, filesz) = (header(u64_at(at + 8))?, header(u64_at(at + 32))?);
        // PT_LOAD, PT_DYNAMIC: what the loader maps and reads.
        if matches!(p_type, 1 | 2) && !within(offset, filesz) {
            return Err(format!(
                "segment {i} (bytes {offset}..{}) runs past the end of the file ({len} bytes): truncated?",
                offset.saturating_add(filesz)
            ));
        }
    }
    let (shoff, shentsize, shnum) =
        (header(u64_at(40))?, header(u16_at(58).map(u64::from))?, header(u16_at(60).map(u64::from))?);
    if shnum > 0 && !within(shoff, shentsize * shnum) {
        return Err(format!("its section header table runs past the end of the file ({len} bytes): truncated?"));
    }
    Ok(())
}

/// `e_machine` of this build's target.
const MACHINE: Option<u64> = if cfg!(target_arch = "x86_64") {
    Some(62)
} else if cfg!(target_arch = "aarch64") {
    Some(183)
} else {
    None
};
