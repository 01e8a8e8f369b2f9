use super::*;

fn stream(base: &[u8], seq: u64) -> StreamState {
    StreamState {
        capture: Some(Capture::new(1024)),
        marker: marker(base, seq),
        ..StreamState::default()
    }
}

#[test]
fn a_marker_split_across_reads_ends_the_output() {
    let mut s = stream(b"\x1eEND-", 1);
    s.feed(b"hello\n\x1eEN");
    s.feed(b"D-");
    assert!(!s.marked);
    s.feed(b"1.after");
    assert!(s.marked);
    s.feed(b"more");
    assert_eq!(s.finish().head, b"hello\n");
}

#[test]
fn output_without_a_marker_is_kept_whole() {
    let mut s = stream(b"\x1eEND-", 1);
    s.feed(b"partial \x1eEND-12");
    assert_eq!(s.finish().head, b"partial \x1eEND-12");
}

#[test]
fn a_late_marker_of_the_last_run_is_skipped_with_what_precedes_it() {
    let streams = Streams::new(b"\x1eEND-".to_vec());
    streams.begin(1024, 1);
    streams.state()[0].feed(b"run one, not yet marked");
    // Run 1's output was taken before its marker came.
    let _ = streams.state()[0].finish();
    streams.begin(1024, 2);
    let s = &mut streams.state()[0];
    s.feed(b" tail of one\x1eEND-1.two says hi\x1eEND-2.");
    assert!(s.marked);
    assert_eq!(s.finish().head, b"two says hi");
}

#[test]
fn results_past_the_cap_give_way_to_one_note() {
    let big = "x".repeat(MAX_CODE_RESULTS_LEN / 2 + 10);
    let results = (0..3)
        .map(|_| ReplyResult {
            data: BTreeMap::from([("image/png".to_string(), big.clone())]),
            is_main_result: false,
        })
        .collect();
    let capped = cap_results(results);
    assert_eq!(capped.len(), 2);
    assert_eq!(capped[0].data[0].1.len(), big.len());
    assert!(
        capped[1].data[0].1.starts_with("[2 more result(s)"),
        "{:?}",
        capped[1]
    );
}

#[test]
fn cut_keeps_char_boundaries() {
    let text = "é".repeat(100);
    let cut = cut(text, 51);
    assert!(cut.contains("omitted"));
    assert!(cut.len() < 120);
}
