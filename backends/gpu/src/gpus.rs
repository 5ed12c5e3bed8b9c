//! What the CUDA and ROCm probes share: reading each of `count` devices with a panic caught
//! per device, so one unreadable device is a note and not the end of detection.

use std::panic::{self, AssertUnwindSafe};

use layerzero_core::exec::executor::panic_text;
use layerzero_core::hardware::profile::DeviceProfile;

/// Reads devices `0..count` with `read(ordinal, notes)`: the devices read, and notes on what
/// was estimated or skipped. `Err` when none could be read. `api` names the devices
/// (`cuda`, `rocm`) in notes and errors.
pub(crate) fn read_all(
    api: &str,
    count: usize,
    read: impl Fn(usize, &mut Vec<String>) -> Result<DeviceProfile, String>,
) -> Result<(Vec<DeviceProfile>, Vec<String>), String> {
    let mut devices = Vec::new();
    let mut notes = Vec::new();
    for ordinal in 0..count {
        let mut dev_notes = Vec::new();
        match panic::catch_unwind(AssertUnwindSafe(|| read(ordinal, &mut dev_notes))) {
            Ok(Ok(d)) => {
                devices.push(d);
                notes.append(&mut dev_notes);
            }
            Ok(Err(e)) => notes.push(e),
            Err(p) => notes.push(format!("{api}:{ordinal}: probing panicked: {}", panic_text(p.as_ref()))),
        }
    }
    if devices.is_empty() {
        let why = if notes.is_empty() { String::new() } else { format!(": {}", notes.join("; ")) };
        return Err(format!("{count} {api} device(s) reported but none could be read{why}"));
    }
    Ok((devices, notes))
}
