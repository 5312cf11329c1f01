use super::*;

#[test]
fn reported_times_and_known_ids_do_not_count_as_differences() {
    let mut ids = Ids::default();
    let (src, dst) = (
        Uuid::from_u128(7).to_string(),
        Uuid::from_u128(9).to_string(),
    );
    ids.insert(src.clone(), dst.clone());
    let a = normalize(
        &format!("[exit code 0 after 0.04 s]\nsee {src}, é{src}\n"),
        &ids.recorded,
    );
    let b = normalize(
        &format!("[exit code 0 after 1.5 s]\nsee {dst}, é{dst}\n"),
        &ids.replayed,
    );
    assert_eq!(a, b);
    assert!(a.contains("see <id 0>, é<id 0>"), "{a}");
    // An id of the other session, or one nobody mapped, stays as it is.
    assert!(normalize(&dst, &ids.recorded).contains(&dst));
    let other = Uuid::from_u128(11).to_string();
    assert_eq!(normalize(&other, &ids.replayed), other);
    assert_eq!(times_out("timed out after 250 ms"), "timed out after … ms");
    assert_eq!(times_out("after all"), "after all");
}

#[test]
fn the_first_differing_line_is_named() {
    let d = first_line_difference("a\nb\nc\n", "a\nB\nc\n").unwrap();
    assert_eq!(d.line, Some(2));
    assert_eq!(d.recorded.as_deref(), Some("b"));
    assert_eq!(d.replayed.as_deref(), Some("B"));
    assert!(first_line_difference("x\n", "x\n").is_none());
    let shorter = first_line_difference("a\nb\n", "a\n").unwrap();
    assert_eq!(shorter.line, Some(2));
}

#[test]
fn arguments_get_the_replays_ids() {
    let mut ids = HashMap::new();
    ids.insert("old".to_owned(), "new".to_owned());
    let mapped = map_ids(&json!({"invocation_id": "old", "n": 1}), &ids);
    assert_eq!(mapped, json!({"invocation_id": "new", "n": 1}));
}
