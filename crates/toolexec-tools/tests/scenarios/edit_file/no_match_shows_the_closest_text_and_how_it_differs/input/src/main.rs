fn main() {
    let name = "world";
    println!("hello, {}", name);
}
