//! `lz lock --plugin PATH` and `lz plugin list|verify`: the lockfile of plugins.

use std::path::{Path, PathBuf};

use super::args::{LockCmd, PluginAction, PluginAddArgs, PluginCmd};
use super::{Outcome, print_json};
use layerzero::backend::plugin::Plugin;
use layerzero::error::Result;
use layerzero::plugins::{LockEntry, Lockfile, open_locked};

fn lock_path(arg: Option<&PathBuf>) -> PathBuf {
    arg.cloned().unwrap_or_else(|| super::knobs().lock_path())
}

/// `lz lock --plugin PATH`: opens the plugin (so only a loadable plugin is pinned) and writes
/// its entry; prints what it pinned, and what it replaced.
pub(super) fn lock(a: &LockCmd) -> Result<Outcome> {
    let path = lock_path(a.lock.as_ref());
    let mut lock = Lockfile::read(&path)?;
    let file = std::fs::canonicalize(&a.plugin).unwrap_or_else(|_| a.plugin.clone());
    let plugin = Plugin::open(&file)?;
    let entry = LockEntry::of(&plugin, file.display().to_string());
    let namespace = entry.namespace();
    let hash = entry.library_blake3.clone();
    let old = lock.upsert(entry);
    lock.write(&path)?;
    match old {
        Some(o) if o.library_blake3 != hash => {
            println!("updated {namespace} in {}: blake3 {} (was {})", path.display(), hash, o.library_blake3);
        }
        Some(_) => println!("{namespace} in {} is unchanged: blake3 {hash}", path.display()),
        None => println!("locked {namespace} in {}: blake3 {hash}", path.display()),
    }
    Ok(Outcome::Ok)
}

pub(super) fn plugin(a: &PluginCmd) -> Result<Outcome> {
    match &a.action {
        PluginAction::List(l) => list(&lock_path(l.lock.as_ref()), l.json),
        PluginAction::Verify(l) => verify(&lock_path(l.lock.as_ref()), l.json),
        PluginAction::Add(a) => add(a),
    }
}

/// `lz plugin add REPO`: the variant for this host, installed, checked and locked. A locked
/// plugin of the same namespace whose hash differs is refused, not replaced.
fn add(a: &PluginAddArgs) -> Result<Outcome> {
    use layerzero::plugins::hub::{self, Installed};
    let path = lock_path(a.lock.as_ref());
    let settings = super::knobs();
    let into = settings.home().join("plugins");
    let source = hub::Source::parse(&a.repo);
    let python = a.python.clone().unwrap_or_else(|| {
        let active = settings.python_prefixes.iter().map(|p| p.join("bin").join("python")).find(|p| p.is_file());
        active.unwrap_or_else(|| PathBuf::from("python3"))
    });
    let added = hub::add(&source, &into, a.expect_hash.as_deref(), &hub::Host::new(python), &path)?;
    for v in &added.variants {
        match &v.rejected {
            None if v.name == added.variant => println!("chose    {}", v.name),
            None => println!("loadable {} (another variant was chosen first)", v.name),
            Some((code, why)) => println!("rejected {}: {why} ({code})", v.name),
        }
    }
    // The lockfile as it is now (a Python package's lock has just written its entry).
    let mut lock = Lockfile::read(&path)?;
    let mut entry = match added.installed {
        Installed::Library(plugin) => LockEntry::of(&plugin, format!("hub {}", a.repo)),
        Installed::Python(mut entry) => {
            entry.source = format!("hub {} ({})", a.repo, entry.source);
            entry.download_blake3 = Some(added.blake3.clone());
            entry
        }
    };
    entry.variant = Some(added.variant.clone());
    if entry.kind == layerzero::plugins::PluginKind::CAbi
        && let Some(old) = lock.plugins.iter().find(|e| e.namespace() == entry.namespace())
        && old.library_blake3 != entry.library_blake3
    {
        return Err(layerzero::backend::plugin::plugin_error(
            layerzero::reason::ReasonCode::PLUGIN_HASH_MISMATCH,
            layerzero::error::ErrorKind::InvalidInput,
            &added.path,
            format!(
                "{} is locked with blake3 {}, but the hub now serves {}; remove its entry first if the change is wanted",
                entry.namespace(),
                old.library_blake3,
                entry.library_blake3
            ),
        ));
    }
    println!("installed {} ({}) at {}", entry.namespace(), added.variant, added.path.display());
    println!("locked {} in {}: blake3 {}", entry.namespace(), path.display(), added.blake3);
    lock.upsert(entry);
    lock.write(&path)?;
    Ok(Outcome::Ok)
}

fn list(path: &Path, json: bool) -> Result<Outcome> {
    let lock = Lockfile::read(path)?;
    if json {
        print_json(&serde_json::to_value(&lock).unwrap_or_default());
    } else if lock.plugins.is_empty() {
        println!("no plugins locked in {}", path.display());
    } else {
        let short = |h: &str| h.get(..16).unwrap_or(h).to_owned();
        for e in &lock.plugins {
            println!(
                "{:<24} {}  library {}  capabilities {}  source {}",
                e.namespace(),
                e.path.display(),
                short(&e.library_blake3),
                short(&e.capabilities_blake3),
                e.source
            );
        }
    }
    Ok(Outcome::Ok)
}

fn verify(path: &Path, json: bool) -> Result<Outcome> {
    let lock = Lockfile::read(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    // Each plugin is opened where the host would open it: an isolated one in its worker.
    let loading = layerzero::plugins::Loading::from_settings(&layerzero::knobs::Settings::from_env()?)?;
    let results: Vec<(String, std::result::Result<(), String>)> = lock
        .plugins
        .iter()
        .map(|e| {
            let checked = match e.kind {
                layerzero::plugins::PluginKind::CAbi => {
                    open_locked(e, base, loading.isolated(&e.name, &e.version)).map(|_| ())
                }
                // A Python package's RECORD is checked here; its files and capabilities when
                // Python imports it.
                layerzero::plugins::PluginKind::Python => {
                    let single = Lockfile { schema_version: lock.schema_version, plugins: vec![e.clone()] };
                    layerzero::plugins::check_python(&single, path, &e.name, &e.version, None, &loading).map(|_| ())
                }
            };
            (e.namespace(), checked.map_err(|err| err.to_string()))
        })
        .collect();
    let bad = results.iter().filter(|(_, r)| r.is_err()).count();
    if json {
        let items: Vec<serde_json::Value> = results
            .iter()
            .map(|(n, r)| serde_json::json!({"plugin": n, "ok": r.is_ok(), "error": r.as_ref().err()}))
            .collect();
        print_json(&serde_json::json!({ "lockfile": path.display().to_string(), "plugins": items, "ok": bad == 0 }));
    } else {
        for (n, r) in &results {
            match r {
                Ok(()) => println!("ok   {n}"),
                Err(e) => println!("FAIL {n}: {e}"),
            }
        }
        println!("{} of {} locked plugins match their files ({})", results.len() - bad, results.len(), path.display());
    }
    Ok(if bad == 0 { Outcome::Ok } else { Outcome::CheckFailed })
}
