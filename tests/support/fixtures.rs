//! The fixture repositories under `tests/fixtures`, as sessions are seeded with them.
#![allow(clippy::unwrap_used)]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `tests/fixtures/<name>`.
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Every text file under `dir`: workspace-relative `/`-separated path → contents. Binary (non
/// UTF-8) files are left out: session seeding takes text only.
pub fn text_files(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(text) = String::from_utf8(std::fs::read(&path).unwrap()) {
                let relative = path.strip_prefix(root).unwrap();
                let parts: Vec<_> = relative
                    .components()
                    .map(|c| c.as_os_str().to_str().unwrap())
                    .collect();
                out.insert(parts.join("/"), text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}
