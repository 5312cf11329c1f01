fn main() {
    let name = "toolexec";
    println!("hello, {}", name);
}
