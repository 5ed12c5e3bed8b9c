//! The worker process of an isolated plugin: the host starts it (`layerzero-plugin-worker
//! --serve`) and speaks to it over its stdin and stdout. Not meant to be run by hand.

fn main() {
    if std::env::args().nth(1).as_deref() != Some("--serve") {
        eprintln!(
            "layerzero-plugin-worker runs an isolated plugin's kernels for a LayerZero host, which starts it \
             with --serve; it is not run by hand"
        );
        std::process::exit(2);
    }
    #[cfg(unix)]
    std::process::exit(layerzero_plugin::worker::serve());
    #[cfg(not(unix))]
    std::process::exit(2);
}
