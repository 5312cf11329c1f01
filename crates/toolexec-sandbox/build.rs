//! Builds `toolexec-sandbox-init` as a **statically linked** executable and hands its path to
//! the crate (`TOOLEXEC_STATIC_INIT`), which embeds it.
//!
//! Why static: the init starts outside every namespace as the sandbox user. A dynamically
//! linked init runs the dynamic loader first, which reads `LD_PRELOAD`, `LD_AUDIT`,
//! `GLIBC_TUNABLES`, … and loads libraries before `main` — before any layer of the sandbox
//! exists. The service already starts the init with an empty environment; a static init has no
//! loader at all, so the same mistake cannot come back through another path.
//!
//! Cargo cannot link one binary of a workspace statically and the rest dynamically
//! (`crt-static` on the host target also breaks proc macros), so this runs a second cargo for
//! the one small crate, with `--target <host>` and `-C target-feature=+crt-static`, into a
//! target directory of its own beside the outer one (shared by every profile, so it is built
//! once). It needs glibc's static archives (`libc6-dev`, which every Rust-on-Debian machine
//! already has for linking).
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let init_crate = manifest.join("../toolexec-sandbox-init");
    let workspace = manifest.join("../..");
    for watched in [
        init_crate.join("src"),
        init_crate.join("Cargo.toml"),
        workspace.join("Cargo.lock"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    println!("cargo:rerun-if-env-changed=TOOLEXEC_STATIC_INIT_TARGET_DIR");

    let target = env("TARGET");
    let out_dir = PathBuf::from(env("OUT_DIR"));
    let target_dir = std::env::var_os("TOOLEXEC_STATIC_INIT_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| outer_target_dir(&out_dir).join("static-init"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--locked", "--quiet"])
        .args([
            "-p",
            "toolexec-sandbox-init",
            "--bin",
            "toolexec-sandbox-init",
        ])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args(["--target", &target])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        // Small and without symbols: it is embedded in the service binary.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        // Fully optimised whatever the outer profile (the workspace's `release` is the quick
        // one): it is built once, shared by every profile, and is what every command forks.
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        // The outer build's settings are not this build's: clippy's wrapper (when the outer
        // command is `cargo clippy`), its flags, a `--target` of its own.
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    let status = cmd.status().unwrap_or_else(|e| {
        fail(&format!(
            "could not run cargo for the static sandbox init: {e}"
        ))
    });
    if !status.success() {
        fail(&format!(
            "building the static sandbox init failed ({status}); it needs glibc's static libraries (Debian: libc6-dev)"
        ));
    }
    let binary = target_dir
        .join(&target)
        .join("release")
        .join("toolexec-sandbox-init");
    if !binary.is_file() {
        fail(&format!("{} was not built", binary.display()));
    }
    // Copied next to the outputs of this build script, so that a later build of another
    // profile replacing the shared binary cannot change what an earlier build embedded.
    let embedded = out_dir.join("toolexec-sandbox-init");
    std::fs::copy(&binary, &embedded).unwrap_or_else(|e| {
        fail(&format!("copying {}: {e}", binary.display()));
    });
    println!(
        "cargo:rustc-env=TOOLEXEC_STATIC_INIT={}",
        embedded.display()
    );
}

/// The outer build's target directory: the ancestor of `OUT_DIR` that cargo marked with
/// `CACHEDIR.TAG` (`<target>/<profile>/build/<pkg>/out`, or with `--target`,
/// `<target>/<triple>/<profile>/build/<pkg>/out`).
fn outer_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out_dir.to_path_buf())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| fail(&format!("{name} is not set")))
}

fn fail(message: &str) -> ! {
    eprintln!("toolexec-sandbox build: {message}");
    std::process::exit(1)
}
