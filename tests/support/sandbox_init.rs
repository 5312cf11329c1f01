//! `toolexec-sandbox-init` under a name of this package, so that the tests can find it with
//! `CARGO_BIN_EXE_toolexec-test-sandbox-init`.
fn main() {
    toolexec_sandbox::init::main()
}
