//! The workspace's dependency requirements (CPU only): the frameworks are required with the
//! widest ranges that compile, never pinned with `=`, and Cargo.lock holds the lowest version
//! each range allows, so CI builds and tests exactly the oldest release a user may resolve.

use std::path::{Path, PathBuf};

use semver::{Op, Version, VersionReq};

/// Dependencies whose requirement users' projects must be able to share.
const FRAMEWORKS: &[&str] = &[
    "burn",
    "burn-backend",
    "burn-core",
    "burn-optim",
    "burn-nn",
    "burn-fusion",
    "burn-ir",
    "burn-ndarray",
    "burn-autodiff",
    "candle-core",
    "candle-nn",
    "cudarc",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The version requirement of a dependency entry (`"1.2"` or `{ version = "1.2", .. }`).
fn requirement(entry: &toml::Value) -> Option<String> {
    match entry {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Table(t) => t.get("version").and_then(|v| v.as_str()).map(str::to_owned),
        _ => None,
    }
}

/// Every (table name, dependency, requirement) of a manifest's dependency tables.
fn requirements(manifest: &toml::Table) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut tables: Vec<(String, &toml::Table)> = Vec::new();
    for key in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(t) = manifest.get(key).and_then(|v| v.as_table()) {
            tables.push((key.to_owned(), t));
        }
    }
    if let Some(t) = manifest
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(|v| v.as_table())
    {
        tables.push(("workspace.dependencies".to_owned(), t));
    }
    for (table, deps) in tables {
        for (name, entry) in deps {
            if let Some(req) = requirement(entry) {
                out.push((table.clone(), name.clone(), req));
            }
        }
    }
    out
}

/// The lowest version a caret or tilde requirement allows (`"0.21"` → 0.21.0).
fn lowest(req: &VersionReq) -> Option<Version> {
    let [c] = &req.comparators[..] else {
        return None;
    };
    matches!(c.op, Op::Caret | Op::Tilde | Op::GreaterEq)
        .then(|| Version::new(c.major, c.minor.unwrap_or(0), c.patch.unwrap_or(0)))
}

/// The locked versions of `name`.
fn locked(lock: &toml::Table, name: &str) -> Vec<Version> {
    lock["package"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str() == Some(name))
        .map(|p| Version::parse(p["version"].as_str().unwrap()).unwrap())
        .collect()
}

fn manifests() -> Vec<PathBuf> {
    let r = root();
    [
        "Cargo.toml",
        "backend/Cargo.toml",
        "kernels/Cargo.toml",
        "examples/Cargo.toml",
    ]
    .iter()
    .map(|p| r.join(p))
    .collect()
}

#[test]
fn framework_requirements_are_ranges_not_pins() {
    let mut pinned = Vec::new();
    for path in manifests() {
        for (table, name, req) in requirements(&read_toml(&path)) {
            if FRAMEWORKS.contains(&name.as_str()) && req.trim_start().starts_with('=') {
                pinned.push(format!("{}: [{table}] {name} = \"{req}\"", path.display()));
            }
        }
    }
    assert!(
        pinned.is_empty(),
        "exact pins stop users' projects from taking patch releases: {pinned:#?}"
    );
}

#[test]
fn the_lockfile_holds_the_lowest_allowed_framework_versions() {
    let lock = read_toml(&root().join("Cargo.lock"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for path in manifests() {
        for (table, name, req) in requirements(&read_toml(&path)) {
            if !FRAMEWORKS.contains(&name.as_str()) {
                continue;
            }
            let parsed = VersionReq::parse(&req).unwrap_or_else(|e| panic!("{name} = \"{req}\": {e}"));
            let Some(min) = lowest(&parsed) else {
                wrong.push(format!(
                    "[{table}] {name} = \"{req}\" is not a single caret/tilde/>= range"
                ));
                continue;
            };
            let in_range: Vec<Version> = locked(&lock, &name).into_iter().filter(|v| parsed.matches(v)).collect();
            checked += 1;
            if in_range != [min.clone()] {
                wrong.push(format!(
                    "{}: [{table}] {name} = \"{req}\" allows {min} at the lowest, but Cargo.lock has {in_range:?} \
                     (run `cargo update -p {name} --precise {min}`)",
                    path.display()
                ));
            }
        }
    }
    assert!(
        checked >= FRAMEWORKS.len(),
        "only {checked} framework requirements found"
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}
