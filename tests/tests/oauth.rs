//! OAuth 2.1 end to end: headless Chromium (Debian's, driven by Playwright)
//! signs in to `outpost mcp --http` as a hosted agent would (discovery from
//! the 401, registration, PKCE, the consent page, the redirect back), then
//! the codes are exchanged and used for `tools/call`; every refusal the
//! server owes is checked with plain HTTP: a wrong approval code, a reused
//! code, a bad verifier, a foreign redirect URI, a token on the wrong
//! resource, an expired one, a replayed refresh token, and grants ended by
//! `/revoke` and by `outpost auth revoke`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use outpost_e2e::{McpHttp, node_modules, target_bin, test_node};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

struct Reply {
    status: u16,
    head: String,
    body: String,
}

/// One request on its own connection, naming `host`.
fn http(addr: &str, host: &str, method: &str, path: &str, auth: Option<&str>, body: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let kind = if body.starts_with('{') {
        "application/json"
    } else {
        "application/x-www-form-urlencoded"
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: {kind}\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    Reply {
        status: head[9..12].parse().unwrap(),
        head: head.to_lowercase(),
        body: body.to_string(),
    }
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The token endpoint's answer: status and JSON.
fn token(server: &McpHttp, pairs: &[(&str, &str)]) -> (u16, Value) {
    let r = http(
        &server.addr,
        &server.addr,
        "POST",
        "/token",
        None,
        &form(pairs),
    );
    let body = serde_json::from_str(r.body.trim()).unwrap_or(json!(r.body));
    (r.status, body)
}

/// Whether `/mcp` takes `access`: the answer to an `initialize`.
fn mcp_status(server: &McpHttp, host: &str, access: &str) -> Reply {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "oauth-test", "version": "1"}}});
    http(
        &server.addr,
        host,
        "POST",
        "/mcp",
        Some(access),
        &body.to_string(),
    )
}

fn artifacts() -> PathBuf {
    let dir = target_bin("outpost")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sets every live access token's expiry in the server's records to the
/// past, as an hour going by would.
fn age_access_tokens(server: &McpHttp) {
    let path = server.home.path().join(".outpost/oauth.json");
    let mut records: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for grant in records["grants"].as_array_mut().unwrap() {
        for access in grant["access"].as_array_mut().unwrap() {
            access[1] = json!(1);
        }
    }
    let tmp = path.with_extension("aged");
    std::fs::write(&tmp, records.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_and_every_bad_grant_is_refused() {
    let playwright = node_modules().join("playwright-core");
    assert!(
        playwright.join("package.json").exists()
            && std::path::Path::new("/usr/bin/chromium").exists(),
        "Playwright or Chromium is missing: run scripts/setup-test-env (it installs both)"
    );
    let server = McpHttp::start();
    let mcp_url = format!("http://{}/mcp", server.addr);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/oauth_signin.mjs");
    let out = Command::new(test_node())
        .arg(script)
        .args([&mcp_url, &server.approval_code(), &server.token, "4"])
        .arg(artifacts())
        .env("PLAYWRIGHT_CORE", &playwright)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let signed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(signed["wrong_code_refused"], true, "{signed}");
    assert!(artifacts().join("oauth-consent.png").exists());
    let client_id = signed["client_id"].as_str().unwrap();
    let redirect = signed["redirect_uri"].as_str().unwrap();
    let signin = |i: usize| {
        let s = &signed["signins"][i];
        (
            s["code"].as_str().unwrap().to_string(),
            s["verifier"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(
        signed["signins"][0]["iss"],
        format!("http://{}", server.addr)
    );
    let exchange = |code: &str, verifier: &str| {
        token(
            &server,
            &[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", redirect),
                ("client_id", client_id),
                ("code_verifier", verifier),
                ("resource", &mcp_url),
            ],
        )
    };

    // The first code: tokens, and a tool call with them.
    let (code, verifier) = signin(0);
    let (status, tokens) = exchange(&code, &verifier);
    assert_eq!(status, 200, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap().to_string();
    let refresh = tokens["refresh_token"].as_str().unwrap().to_string();
    assert_eq!(tokens["token_type"], "Bearer");
    let client = server.client_with_token((), &access).await;
    let result = client
        .call_tool(
            CallToolRequestParams::new("exec_bash").with_arguments(
                json!({"command": "echo via-oauth"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(result.structured_content.unwrap()["stdout"], "via-oauth\n");
    client.cancel().await.unwrap();
    let audit = std::fs::read_to_string(server.home.path().join(".outpost/audit.jsonl")).unwrap();
    let line: Value = serde_json::from_str(audit.lines().last().unwrap()).unwrap();
    assert_eq!(line["subject"], "owner", "{line}");
    assert!(
        line["oauth_client"].as_str().unwrap().contains(client_id),
        "{line}"
    );

    // The same token named for another resource (another Host): refused.
    let port = server.addr.rsplit(':').next().unwrap();
    let r = mcp_status(&server, &format!("localhost:{port}"), &access);
    assert_eq!(r.status, 401);
    assert!(
        r.head.contains("invalid_token") && r.head.contains("another resource"),
        "{}",
        r.head
    );
    // An hour later: expired, and the refresh token gets a new one.
    age_access_tokens(&server);
    let r = mcp_status(&server, &server.addr, &access);
    assert_eq!(r.status, 401);
    assert!(r.head.contains("expired"), "{}", r.head);
    let refreshed = |refresh: &str| {
        token(
            &server,
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh),
                ("client_id", client_id),
            ],
        )
    };
    let (status, renewed) = refreshed(&refresh);
    assert_eq!(status, 200, "{renewed}");
    let access = renewed["access_token"].as_str().unwrap().to_string();
    assert_eq!(mcp_status(&server, &server.addr, &access).status, 200);
    // The spent refresh token again: refused, and the grant ends.
    let (status, r) = refreshed(&refresh);
    assert_eq!(
        (status, r["error"].as_str()),
        (400, Some("invalid_grant")),
        "{r}"
    );
    assert_eq!(mcp_status(&server, &server.addr, &access).status, 401);

    // The second code: a bad verifier, then the right one (spent already).
    let (code, verifier) = signin(1);
    let (status, r) = exchange(&code, &"x".repeat(64));
    assert_eq!(
        (status, r["error"].as_str()),
        (400, Some("invalid_grant")),
        "{r}"
    );
    assert!(r.to_string().contains("PKCE"), "{r}");
    let (status, _) = exchange(&code, &verifier);
    assert_eq!(status, 400);

    // The third: used twice, the second use revokes the first's tokens.
    let (code, verifier) = signin(2);
    let (status, first) = exchange(&code, &verifier);
    assert_eq!(status, 200, "{first}");
    let access = first["access_token"].as_str().unwrap();
    assert_eq!(mcp_status(&server, &server.addr, access).status, 200);
    let (status, r) = exchange(&code, &verifier);
    assert_eq!(
        (status, r["error"].as_str()),
        (400, Some("invalid_grant")),
        "{r}"
    );
    assert_eq!(mcp_status(&server, &server.addr, access).status, 401);

    // The fourth: ended by the revocation endpoint, with its refresh token.
    let (code, verifier) = signin(3);
    let (status, fourth) = exchange(&code, &verifier);
    assert_eq!(status, 200, "{fourth}");
    let access = fourth["access_token"].as_str().unwrap();
    let list = Command::new(target_bin("outpost"))
        .args(["auth", "list"])
        .env("HOME", server.home.path())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(listed.contains("Browser <b>test</b> client"), "{listed}");
    assert!(!listed.contains(access), "a token shown: {listed}");
    let r = http(
        &server.addr,
        &server.addr,
        "POST",
        "/revoke",
        None,
        &form(&[("token", fourth["refresh_token"].as_str().unwrap())]),
    );
    assert_eq!(r.status, 200);
    assert_eq!(mcp_status(&server, &server.addr, access).status, 401);

    // A foreign redirect URI: no registration, and no redirect there.
    let r = http(
        &server.addr,
        &server.addr,
        "POST",
        "/register",
        None,
        &json!({"client_name": "x", "redirect_uris": ["http://evil.example/cb"]}).to_string(),
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("invalid_redirect_uri"), "{}", r.body);
    let path = format!(
        "/authorize?{}",
        form(&[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", "https://evil.example/cb"),
            ("code_challenge", &"a".repeat(43)),
            ("code_challenge_method", "S256"),
        ])
    );
    let r = http(&server.addr, &server.addr, "GET", &path, None, "");
    assert_eq!(r.status, 400);
    assert!(!r.head.contains("location:"), "{}", r.head);

    // A grant ended from the command line.
    let r = http(
        &server.addr,
        &server.addr,
        "GET",
        "/.well-known/oauth-authorization-server",
        None,
        "",
    );
    let metadata: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        metadata["code_challenge_methods_supported"],
        json!(["S256"])
    );
}

/// The CLI ends a grant the server then refuses, without a restart.
#[test]
fn outpost_auth_revoke_ends_a_grant_at_once() {
    let server = McpHttp::start();
    // A grant made through the records as the server makes them.
    let (client_id, access) = server.oauth_grant(&format!("http://{}/mcp", server.addr));
    assert_eq!(mcp_status(&server, &server.addr, &access).status, 200);
    let out = Command::new(target_bin("outpost"))
        .args(["auth", "revoke", &client_id])
        .env("HOME", server.home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = mcp_status(&server, &server.addr, &access);
    assert_eq!(r.status, 401);
    assert!(r.head.contains("resource_metadata="), "{}", r.head);
    let out = Command::new(target_bin("outpost"))
        .args(["auth", "revoke", &client_id])
        .env("HOME", server.home.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no grant"));
}

/// The status page in Chromium: signed in once, it shows the local host
/// with its charts, then a sandbox and a job made meanwhile, and the job
/// ending, all without a reload; no script error, nothing fetched elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_follows_sandboxes_and_jobs_live() {
    use std::io::BufRead;
    let playwright = node_modules().join("playwright-core");
    // The local agent reads two GPUs through NVML's test double.
    let nvml = outpost_e2e::fake_nvml_lib();
    let leases = outpost_e2e::TempDir::new("status-gpu-leases");
    let server = McpHttp::start_with_env(&[
        ("OUTPOST_NVML_LIB", nvml.display().to_string()),
        (
            "OUTPOST_GPU_LEASE_DIR",
            leases.path().join("table").display().to_string(),
        ),
    ]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/status_page.mjs");
    let mut browser = Command::new(test_node())
        .arg(script)
        .args([&format!("http://{}", server.addr), &server.token])
        .arg(artifacts())
        .env("PLAYWRIGHT_CORE", &playwright)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(browser.stdout.take().unwrap()).lines();
    assert_eq!(said.next().unwrap().unwrap(), "ready");

    // Without the token or a cookie, nothing but the sign-in form.
    let r = http(
        &server.addr,
        &server.addr,
        "GET",
        "/status/events",
        None,
        "",
    );
    assert_eq!(r.status, 401);
    let r = http(&server.addr, &server.addr, "GET", "/", None, "");
    assert!(
        r.body.contains("action=/login") && !r.body.contains("status.js"),
        "{}",
        r.body
    );

    let client = server.client(()).await;
    let call = |tool: &'static str, args: Value| {
        let client = &client;
        async move {
            let r = client
                .call_tool(
                    CallToolRequestParams::new(tool)
                        .with_arguments(args.as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            assert!(!r.is_error.unwrap_or(false), "{tool}: {r:?}");
            r.structured_content.unwrap()
        }
    };
    let made = call(
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 600}),
    )
    .await;
    let sandbox = made["sandbox_name"].as_str().unwrap();
    let job = call(
        "exec_bash_background",
        json!({"command": "echo started; sleep 6; echo finished"}),
    )
    .await;
    let job = job["tmux_session"].as_str().unwrap();
    writeln!(browser.stdin.as_mut().unwrap(), "{sandbox} {job}").unwrap();
    let report: Value = serde_json::from_str(&said.next().unwrap().unwrap()).unwrap();
    assert!(browser.wait().unwrap().success(), "{report}");
    assert_eq!(report["navigations"], 0, "the page reloaded: {report}");
    assert_eq!(report["ended"], "exited", "{report}");
    assert_eq!(report["failures"], json!([]), "{report}");
    assert_eq!(
        report["gpu_charts"], 4,
        "two GPUs, use and memory: {report}"
    );
    eprintln!(
        "status page: first render {} ms after sign-in",
        report["render_ms"]
    );
    assert!(artifacts().join("status-page.png").exists());
    client.cancel().await.unwrap();
}

/// `[oauth]`: tokens from an external authorization server (JWTs by keys
/// in a JWKS file; made here with Node's own crypto) are taken for their
/// issuer, audience and lifetime, and every other refused; the metadata
/// points clients there and the built-in endpoints are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_authorization_servers_tokens_are_checked() {
    let issuer = "https://auth.example.test";
    let audience = "https://outpost.example.test/mcp";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/node/jwt.mjs");
    let out = Command::new(test_node())
        .args([script, issuer, audience])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let made: Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys = outpost_e2e::TempDir::new("jwks");
    let jwks = keys.path().join("jwks.json");
    std::fs::write(&jwks, made["jwks"].to_string()).unwrap();
    let server = McpHttp::start_configured(&format!(
        "[oauth]\nissuer = \"{issuer}\"\njwks = \"{}\"\naudience = \"{audience}\"\n",
        jwks.display()
    ));
    let token = |name: &str| made["tokens"][name].as_str().unwrap().to_string();

    let r = mcp_status(&server, &server.addr, &token("good"));
    assert_eq!(r.status, 200, "{}", r.body);
    let client = server.client_with_token((), &token("good")).await;
    let result = client
        .call_tool(
            CallToolRequestParams::new("exec_bash")
                .with_arguments(json!({"command": "echo team"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(result.structured_content.unwrap()["stdout"], "team\n");
    client.cancel().await.unwrap();
    let audit = std::fs::read_to_string(server.home.path().join(".outpost/audit.jsonl")).unwrap();
    let line: Value = serde_json::from_str(audit.lines().last().unwrap()).unwrap();
    assert_eq!(line["subject"], "alice@example.test", "{line}");
    assert_eq!(line["oauth_client"], "team-agent", "{line}");

    for (name, says) in [
        ("wrong_audience", "another resource"),
        ("expired", "expired"),
        ("wrong_issuer", "not one this server"),
        ("other_key", "not one this server"),
        ("unknown_kid", "not one this server"),
        ("symmetric", "not one this server"),
        ("no_subject", "not one this server"),
    ] {
        let r = mcp_status(&server, &server.addr, &token(name));
        assert_eq!(r.status, 401, "{name}: {}", r.body);
        assert!(r.body.contains(says), "{name}: {}", r.body);
    }

    let r = http(
        &server.addr,
        &server.addr,
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        None,
        "",
    );
    let metadata: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(metadata["authorization_servers"], json!([issuer]));
    for path in ["/.well-known/oauth-authorization-server", "/register"] {
        let r = http(&server.addr, &server.addr, "GET", path, None, "");
        assert_eq!(r.status, 404, "{path}");
    }
}

/// `--public-url`: behind a TLS proxy, requests naming its host are served
/// and OAuth names the https URL as resource and issuer; a token issued for
/// the proxy's URL is refused when the request did not come through it.
#[test]
fn behind_a_proxy_oauth_names_the_public_url() {
    let server = McpHttp::start_public("https://outpost.example.test");
    let proxy_host = "outpost.example.test";
    let r = http(
        &server.addr,
        proxy_host,
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        None,
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let metadata: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(metadata["resource"], "https://outpost.example.test/mcp");
    assert_eq!(
        metadata["authorization_servers"],
        json!(["https://outpost.example.test"])
    );
    let r = mcp_status(&server, proxy_host, "nope");
    assert_eq!(r.status, 401);
    assert!(
        r.head
            .contains("resource_metadata=\"https://outpost.example.test/.well-known/"),
        "{}",
        r.head
    );
    let (_, access) = server.oauth_grant("https://outpost.example.test/mcp");
    assert_eq!(mcp_status(&server, proxy_host, &access).status, 200);
    assert_eq!(mcp_status(&server, &server.addr, &access).status, 401);
    // Other names are still refused.
    let r = mcp_status(&server, "evil.example.test", &server.token);
    assert_eq!(r.status, 403);
}
