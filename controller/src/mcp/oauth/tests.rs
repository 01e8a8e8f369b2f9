use super::*;

fn authority(token: &str) -> (Authority, std::path::PathBuf) {
    let home = std::env::temp_dir().join(format!("outpost-oauth-{}", std::process::id()));
    let mut config = crate::config::Config::new(Vec::new(), home.join("known_hosts"));
    config.home = home.clone();
    let tokens = Arc::new(Tokens::only(token));
    let authority = Authority::new(&config, tokens, vec!["127.0.0.1".into()], None).unwrap();
    (authority, home)
}

fn code(authority: &Authority) -> String {
    authority.approval.lock().unwrap().code.clone()
}

#[test]
fn approval_codes_work_once_and_wrong_ones_lock_codes_out() {
    let token = "t".repeat(32);
    let (authority, home) = authority(&token);
    let first = code(&authority);
    assert_eq!(first.len(), 10);
    assert!(
        first
            .bytes()
            .all(|b| b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789".contains(&b))
    );
    let typed = format!("{}-{}", &first[..5], first[5..].to_lowercase());
    assert!(authority.approves(&typed));
    assert!(!authority.approves(&typed), "a code works once");
    let second = code(&authority);
    assert_ne!(first, second);
    // The spent code was the first wrong try.
    for _ in 0..MAX_WRONG - 2 {
        assert!(matches!(authority.proven("AAAAA-AAAAA"), Proof::Wrong));
    }
    // The fifth wrong try locks codes out, the right one included; the
    // code itself stays, and the token still works.
    assert!(matches!(authority.proven("AAAAA-AAAAA"), Proof::Wrong));
    assert!(matches!(authority.proven(&second), Proof::Locked(_)));
    assert_eq!(code(&authority), second);
    assert!(authority.approves(&token));
    authority.approval.lock().unwrap().locked_until = Some(Instant::now());
    assert!(authority.approves(&second));
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn redirect_uris_are_https_or_loopback_and_loopback_ports_may_move() {
    for ok in [
        "https://claude.ai/api/mcp/auth_callback",
        "http://127.0.0.1:33418/callback",
        "http://localhost/cb",
        "http://[::1]:9/cb",
    ] {
        assert!(redirect_allowed(ok).is_ok(), "{ok}");
    }
    for bad in [
        "http://evil.example/cb",
        "http://127.0.0.1.evil.example/cb",
        "javascript:alert(1)",
        "https://ok.example/cb#frag",
        "not a url",
    ] {
        assert!(redirect_allowed(bad).is_err(), "{bad}");
    }
    assert!(same_redirect(
        "http://127.0.0.1:1/cb",
        "http://127.0.0.1:2/cb"
    ));
    assert!(!same_redirect(
        "http://127.0.0.1:1/cb",
        "http://127.0.0.1:2/other"
    ));
    assert!(!same_redirect(
        "https://a.example:1/cb",
        "https://a.example:2/cb"
    ));
}

#[test]
fn parameters_may_not_repeat() {
    assert!(single_params(b"a=1&b=2").is_ok());
    let err = single_params(b"a=1&a=2").unwrap_err();
    assert!(err.contains("twice"), "{err}");
}

#[test]
fn pkce_values_have_their_shape() {
    assert!(pkce_shaped(&"a".repeat(43), 43));
    assert!(!pkce_shaped(&"a".repeat(42), 43));
    assert!(!pkce_shaped(&"a".repeat(129), 43));
    assert!(!pkce_shaped(&format!("{}+", "a".repeat(43)), 43));
}
