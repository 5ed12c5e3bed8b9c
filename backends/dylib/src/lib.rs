//! Shared libraries loaded at run time (`libloading`): which of a backend's candidate library
//! names this host can load.

#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::error::Error as _;

/// The `dlopen` error with its cause: libloading's `Display` says only "dlopen failed"; the
/// real reason (`cannot open shared object file: No such file or directory`) is its source.
pub fn describe(e: &libloading::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Loads one library by name (or path); the handle is closed again before returning.
#[allow(unsafe_code)]
fn try_load(name: &str) -> Result<(), String> {
    // SAFETY: loading a shared library runs its initialisers. The names come from the
    // backend's capability file (`probe.libraries`) and name the vendor libraries that
    // backend executes through (libcuda, libdnnl, ...), whose initialisers are designed to
    // be run by any host process; no symbol is resolved or called here.
    let lib = unsafe { libloading::Library::new(name) };
    match lib {
        Ok(lib) => {
            // Closing a library we just opened only drops our reference to it.
            let _ = lib.close();
            Ok(())
        }
        Err(e) => Err(describe(&e)),
    }
}

/// The first of `names` that loads, tried in order. On failure the reason lists every name
/// tried and its `dlopen` error.
pub fn first_loadable(names: &[String]) -> Result<String, String> {
    if names.is_empty() {
        return Err("no library names to try".to_owned());
    }
    let mut failures = Vec::with_capacity(names.len());
    for name in names {
        match try_load(name) {
            Ok(()) => return Ok(name.clone()),
            Err(why) => failures.push(format!("{name} ({why})")),
        }
    }
    Err(format!("none of {} could be loaded: {}", names.len(), failures.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a unit test returns: a failed call is an `Err` the harness prints, not a panic.
    type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn missing_libraries_are_listed_with_the_dlopen_reason() -> TestResult {
        let names = vec!["liblz_does_not_exist.so".to_owned(), "/nope/libalso_missing.so.3".to_owned()];
        let e = first_loadable(&names).err().ok_or("a missing library loaded")?;
        assert!(e.contains("liblz_does_not_exist.so") && e.contains("/nope/libalso_missing.so.3"), "{e}");
        #[cfg(target_os = "linux")]
        assert!(e.contains("No such file") || e.contains("cannot open"), "{e}");
        Ok(())
    }

    #[test]
    fn empty_list_is_an_error() {
        assert!(first_loadable(&[]).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn libc_loads_and_the_first_loadable_name_is_returned() -> TestResult {
        let names = vec!["liblz_does_not_exist.so".to_owned(), "libc.so.6".to_owned(), "libm.so.6".to_owned()];
        assert_eq!(first_loadable(&names)?, "libc.so.6");
        Ok(())
    }
}
