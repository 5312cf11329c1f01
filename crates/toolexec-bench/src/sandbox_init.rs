//! `toolexec-sandbox-init` under the bench's name, built with the bench: see `toolexec_sandbox::init`.
fn main() {
    toolexec_sandbox::init::main()
}
