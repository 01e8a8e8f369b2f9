use super::*;
use outpost_protocol::{CapturedOutput, CodeError, CodeResult};
use serde_json::{Value, json};

fn captured(text: &str) -> CapturedOutput {
    CapturedOutput {
        head: text.as_bytes().to_vec(),
        ..CapturedOutput::default()
    }
}

fn result(data: &[(&str, &str)], main: bool) -> CodeResult {
    CodeResult {
        data: data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        is_main_result: main,
    }
}

/// The JSON block and the image blocks of a result.
fn parts(r: &CallToolResult) -> (Value, Vec<(String, String)>) {
    let json = serde_json::from_str(&r.content[0].as_text().unwrap().text).unwrap();
    let images = r.content[1..]
        .iter()
        .map(|c| {
            let i = c.as_image().unwrap();
            (i.data.clone(), i.mime_type.clone())
        })
        .collect();
    (json, images)
}

/// A PNG's signature and header (all a check reads), as base64.
fn png(w: u32, h: u32) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    bytes.extend(w.to_be_bytes());
    bytes.extend(h.to_be_bytes());
    bytes.extend([8, 6, 0, 0, 0]);
    BASE64.encode(bytes)
}

#[test]
fn images_become_image_blocks_named_in_the_json() {
    let (one, two) = (png(640, 480), png(1, 1));
    let exec = CodeExecution {
        results: vec![
            result(&[("text/plain", "<Figure>"), ("image/png", &one)], false),
            result(
                &[
                    ("text/plain", "   a\n0  1"),
                    ("text/html", "<table>…</table>"),
                ],
                false,
            ),
            result(&[("image/png", &two)], false),
            result(&[("text/plain", "42")], true),
        ],
        stdout: captured("hi\n"),
        execution_count: 2,
        duration_ms: 3,
        ..CodeExecution::default()
    };
    let r = run_result(exec, Some("execute_code(code=\"\")".into()), None);
    assert_eq!(r.is_error, Some(false));
    let (json, images) = parts(&r);
    assert_eq!(
        json,
        json!({
            "results": [
                {"text/plain": "<Figure>", "image/png": "[image 1]"},
                {"text/plain": "   a\n0  1"},
                {"image/png": "[image 2]"},
                {"text/plain": "42"}
            ],
            "stdout": "hi\n",
            "execution_count": 2,
            "duration_s": 0.003
        })
    );
    assert_eq!(
        images,
        [
            (one.clone(), "image/png".to_string()),
            (two, "image/png".to_string())
        ]
    );
    // HTML alone is the value itself: kept.
    let html = CodeExecution {
        results: vec![result(&[("text/html", "<b>x</b>")], true)],
        ..CodeExecution::default()
    };
    let (json, _) = parts(&run_result(html, None, None));
    assert_eq!(json["results"], json!([{"text/html": "<b>x</b>"}]));
}

#[test]
fn html_is_kept_where_the_plain_text_says_nothing() {
    let bundle_of = |data: &[(&str, &str)]| {
        let exec = CodeExecution {
            results: vec![result(data, true)],
            ..CodeExecution::default()
        };
        parts(&run_result(exec, None, None)).0["results"][0].clone()
    };
    // An IPython HTML object, a DataFrame's Styler: the plain text is
    // Python's default repr, the HTML is the value.
    for plain in [
        "<IPython.core.display.HTML object>",
        "<pandas.io.formats.style.Styler object at 0x7f3a2b1c>",
    ] {
        assert_eq!(
            bundle_of(&[("text/plain", plain), ("text/html", "<b>x</b>")]),
            json!({"text/html": "<b>x</b>"}),
            "{plain}"
        );
    }
    // A default repr alone stays: it is all there is.
    assert_eq!(
        bundle_of(&[("text/plain", "<Foo object at 0xABC>")]),
        json!({"text/plain": "<Foo object at 0xABC>"})
    );
    // A repr that says something is not a default one.
    for plain in ["<Figure size 640x480 with 1 Axes>", "<b> object"] {
        assert!(!is_default_repr(plain), "{plain}");
    }
    // SVG beside a PNG or a real repr says nothing more; alone, or
    // beside a default repr, it is the value.
    let svg = "<svg>…</svg>";
    let figure = png(10, 10);
    assert_eq!(
        bundle_of(&[("image/svg+xml", svg), ("image/png", &figure)]),
        json!({"image/png": "[image 1]"})
    );
    assert_eq!(
        bundle_of(&[("text/plain", "<Figure size 1x1>"), ("image/svg+xml", svg)]),
        json!({"text/plain": "<Figure size 1x1>"})
    );
    assert_eq!(
        bundle_of(&[("text/plain", "<a.B object>"), ("image/svg+xml", svg)]),
        json!({"text/plain": "<a.B object>", "image/svg+xml": svg})
    );
}

#[test]
fn long_values_and_tracebacks_are_cut_head_and_tail() {
    let long = format!("{}{}", "a".repeat(30_000), "z".repeat(30_000));
    let exec = CodeExecution {
        results: vec![result(
            &[("text/html", &long), ("application/json", &long)],
            true,
        )],
        error: Some(CodeError {
            name: "E".into(),
            value: long.clone(),
            traceback: long.clone(),
        }),
        ..CodeExecution::default()
    };
    let (json, _) = parts(&run_result(exec, None, None));
    let cut = [
        &json["results"][0]["text/html"],
        &json["results"][0]["application/json"],
        &json["error"]["value"],
        &json["error"]["traceback"],
    ];
    for value in cut {
        let value = value.as_str().unwrap();
        assert!(
            value.len() <= MAX_VALUE + 40
                && value.starts_with("aaa")
                && value.ends_with("zzz")
                && value.contains("[… 40000 bytes omitted …]"),
            "{}",
            &value[..100]
        );
    }
    assert_eq!(head_tail("short", 10), "short");
    // On character boundaries.
    let cut = head_tail(&"é".repeat(20), 9);
    assert!(cut.starts_with("éé\n[…") && cut.ends_with("]\néé"), "{cut}");
}

#[test]
fn images_that_cannot_be_shown_are_named_not_sent() {
    let gif = BASE64.encode(b"GIF89a\x10\x00\x20\x00rest");
    let mut jpeg = b"\xff\xd8\xff\xe0\x00\x04ab".to_vec();
    jpeg.extend(b"\xff\xc0\x00\x11\x08\x00\x30\x00\x40\x03");
    let jpeg = BASE64.encode(jpeg);
    let mut webp = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
    webp.extend([0x3f, 0x1f, 0x00, 0x0f, 0x00, 0x00]);
    let webp = BASE64.encode(webp);
    // Shown: each type's magic, sizes within bounds; line breaks in
    // the base64 are dropped.
    let wrapped = format!("{}\n{}", &png(8000, 2)[..20], &png(8000, 2)[20..]);
    for (mime, data) in [
        ("image/png", wrapped.as_str()),
        ("image/gif", gif.as_str()),
        ("image/jpeg", jpeg.as_str()),
        ("image/webp", webp.as_str()),
    ] {
        let clean = check_image(mime, data).unwrap_or_else(|e| panic!("{mime}: {e}"));
        assert!(!clean.contains('\n'));
    }
    assert_eq!(
        image_size("image/gif", &BASE64.decode(&gif).unwrap()),
        Some(Some((16, 32)))
    );
    assert_eq!(
        image_size("image/jpeg", &BASE64.decode(&jpeg).unwrap()),
        Some(Some((64, 48)))
    );
    assert_eq!(
        image_size("image/webp", &BASE64.decode(&webp).unwrap()),
        Some(Some((8000, 16)))
    );
    // A JPEG whose size is not found still shows.
    let bare = BASE64.encode(b"\xff\xd8\xff\xe0");
    assert!(check_image("image/jpeg", &bare).is_ok());
    // Left out: bad base64, a type its bytes belie, too many pixels or
    // bytes.
    let huge = BASE64.encode(vec![0u8; MAX_IMAGE_BYTES + 1]);
    for (mime, data, why) in [
        ("image/png", "not base64!", "not valid base64"),
        ("image/png", "iVBORw0KGgo=", "not a valid PNG"),
        ("image/png", jpeg.as_str(), "not a valid PNG"),
        ("image/jpeg", gif.as_str(), "not a valid JPEG"),
        ("image/gif", "AAAA", "not a valid GIF"),
        ("image/webp", gif.as_str(), "not a valid WEBP"),
        ("image/png", &png(8001, 1), "8001x1 px, over 8000"),
        ("image/png", &png(0, 1), "not a valid PNG"),
        ("image/png", &huge, "over 4 MiB"),
    ] {
        let e = check_image(mime, data).unwrap_err();
        assert!(
            e.contains(why),
            "{mime} {}: {e}",
            &data[..data.len().min(20)]
        );
    }
    // In a result: named with why, no block, the next one counted on.
    let exec = CodeExecution {
        results: vec![
            result(&[("image/png", &png(1, 1))], false),
            result(&[("image/png", "AAAA")], false),
            result(&[("image/gif", &gif)], false),
        ],
        ..CodeExecution::default()
    };
    let (json, images) = parts(&run_result(exec, None, None));
    assert_eq!(
        json["results"],
        json!([
            {"image/png": "[image 1]"},
            {"image/png": "[image 2 left out: not a valid PNG]"},
            {"image/gif": "[image 3]"}
        ])
    );
    assert_eq!(images.len(), 2);
}

#[test]
fn exceptions_are_results_and_empty_fields_are_left_out() {
    let exec = CodeExecution {
        error: Some(CodeError {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: "Traceback …\nZeroDivisionError: division by zero".into(),
        }),
        stderr: captured("warn\n"),
        execution_count: 3,
        duration_ms: 1500,
        timed_out: true,
        restarted: Some("it ignored the interrupt".into()),
        ..CodeExecution::default()
    };
    let r = run_result(exec, Some("unused".into()), None);
    assert_eq!(r.is_error, Some(false), "an exception is the run's result");
    let (json, images) = parts(&r);
    assert!(images.is_empty());
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "duration_s",
            "error",
            "execution_count",
            "restarted",
            "stderr",
            "timed_out"
        ]
    );
    assert_eq!(json["error"]["name"], "ZeroDivisionError");
    assert_eq!(json["duration_s"], 1.5);
}

#[test]
fn a_run_still_going_says_how_to_collect_it() {
    let exec = CodeExecution {
        running: true,
        execution_count: 4,
        ..CodeExecution::default()
    };
    let next = collect_call("train", "gpu1/sbx-1");
    let (json, _) = parts(&run_result(exec, Some(next), None));
    assert_eq!(
        json,
        json!({
            "running": true,
            "execution_count": 4,
            "next": "execute_code(code=\"\", context=\"train\", sandbox_name=\"gpu1/sbx-1\")"
        })
    );
    let lost = run_error(
        CallError::ConnectionLost("heartbeat".into()),
        Some(collect_call("default", "local")),
    );
    assert!(
        lost.contains("may go on") && lost.contains("code=\"\""),
        "{lost}"
    );
    let agent = run_error(CallError::Protocol("bad".into()), Some("x".into()));
    assert_eq!(agent, "bad");
}

#[test]
fn a_restart_alone_says_so() {
    let (json, images) = parts(&restarted_result("train"));
    assert_eq!(
        json,
        json!({"restarted": "as asked: context train starts afresh"})
    );
    assert!(images.is_empty());
}

#[test]
fn nothing_starts_once_the_call_has_spent_its_time() {
    let now = Instant::now();
    let budget = Duration::from_secs(45);
    assert!(enough_left(now, budget).is_ok());
    let e = enough_left(now - Duration::from_secs(40), budget).unwrap_err();
    assert!(e.contains("call again"), "{e}");
    // A client that waits little anyway gets half of it.
    let short = Duration::from_secs(10);
    assert!(enough_left(now - Duration::from_secs(3), short).is_ok());
    assert!(enough_left(now - Duration::from_secs(6), short).is_err());
}

#[test]
fn failed_installs_answer_with_the_tails() {
    let ok = ExecResult {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        cancelled: false,
        stdout: captured("Collecting numpy\n…\nSuccessfully installed numpy\n"),
        stderr: CapturedOutput::default(),
        duration_ms: 2500,
        egress_denied: Vec::new(),
        listening: Vec::new(),
    };
    let r = install_result(ok.clone(), Some("unused".into()));
    assert_eq!(r.is_error, Some(false));
    let (json, _) = parts(&r);
    assert_eq!(json, json!({"exit_code": 0, "duration_s": 2.5}));
    let long = format!(
        "{}ERROR: No matching distribution found for nope\n",
        "x\n".repeat(5000)
    );
    let failed = ExecResult {
        exit_code: Some(1),
        stderr: captured(&long),
        ..ok
    };
    let r = install_result(failed, None);
    assert_eq!(r.is_error, Some(true));
    let (json, _) = parts(&r);
    let stderr = json["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("[…]\nx\n") && stderr.ends_with("found for nope\n"),
        "{stderr}"
    );
    assert!(stderr.len() <= INSTALL_TAIL + 10);
    assert!(json["stdout"].as_str().unwrap().contains("Successfully"));
}

#[test]
fn tails_start_at_a_line_and_a_character() {
    assert_eq!(tail("short", 10), "short");
    assert_eq!(tail("aaaa\nbbbb\ncc", 6), "[…]\ncc");
    let t = tail(&"é".repeat(100), 11);
    assert!(t.starts_with("[…]\né"), "{t}");
}

/// Every session pays for the default tool list (the end-to-end tests
/// hold it to a budget): these three tools keep to their share.
#[test]
fn the_code_tools_keep_the_tool_list_small() {
    let config = crate::config::Config::new(
        vec![crate::config::HostConfig::local()],
        std::env::temp_dir().join("outpost-code-test/known_hosts"),
    );
    let server = OutpostServer::new(std::sync::Arc::new(crate::fleet::Fleet::new(config)));
    let tools = server.tool_router.list_all();
    let mut total = 0;
    for name in ["execute_code", "install_package", "create_run_close"] {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        let size = serde_json::to_string(tool).unwrap().len();
        eprintln!("{name}: {size} characters");
        total += size;
    }
    eprintln!("together: {total} characters");
    assert!(total <= 1800, "{total}");
    assert!(!tools.iter().any(|t| t.name == "code_contexts"));
}

#[test]
fn context_rows_are_compact() {
    let row = ContextRow::from(CodeContextInfo {
        name: "default".into(),
        language: outpost_protocol::CodeLanguage::Python,
        state: "idle".into(),
        execution_count: 7,
        pid: Some(12),
        rss_bytes: 50 * 1024 * 1024 + 1,
        last_used_ms: 951_782_400_000,
    });
    assert_eq!(
        serde_json::to_value(&row).unwrap(),
        json!({
            "name": "default",
            "language": "python",
            "state": "idle",
            "execution_count": 7,
            "rss_mb": 51,
            "last_used": "2000-02-29T00:00:00Z"
        })
    );
}
