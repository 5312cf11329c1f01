//! The sandbox init as a small binary of its own (the `toolexec` binary also acts as the init
//! when started with `__sandbox-init`). See `toolexec_sandbox::init`.
fn main() {
    toolexec_sandbox::init::main()
}
