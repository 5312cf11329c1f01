#[test]
fn adds() {}
