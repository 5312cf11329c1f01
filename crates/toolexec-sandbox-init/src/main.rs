//! `toolexec-sandbox-init`: see the library's docs. It takes no arguments and reads no
//! environment; what to run comes on the descriptors the service passes (`spec`).
fn main() {
    toolexec_sandbox_init::main()
}
