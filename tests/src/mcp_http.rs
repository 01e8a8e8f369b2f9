//! [`McpHttp`]: `outpost mcp --http` on a loopback port, for tests over
//! Streamable HTTP.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{TempDir, target_bin};

/// `outpost mcp --http 127.0.0.1:0` with an empty home; killed when
/// dropped. The address and the token come from the client configuration
/// line it prints (the token was made just now).
pub struct McpHttp {
    child: Child,
    /// Bytes the server wrote to stderr after its configuration line.
    pub logged: Arc<AtomicU64>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub token: String,
    pub home: TempDir,
    /// The latest OAuth approval code it printed.
    approval: Arc<Mutex<String>>,
}

impl McpHttp {
    pub fn start() -> McpHttp {
        McpHttp::start_with_callers(&[])
    }

    /// The same with further callers, each a name and its token
    /// (`$OUTPOST_HOME/http-tokens/NAME`).
    pub fn start_with_callers(callers: &[(&str, &str)]) -> McpHttp {
        McpHttp::start_with(callers, None)
    }

    /// The same, the server limited to `nofile` open files (`prlimit`).
    pub fn start_with(callers: &[(&str, &str)], nofile: Option<u32>) -> McpHttp {
        McpHttp::launch(callers, nofile, None, &[], &[])
    }

    /// The same with `config` as its config file
    /// (`~/.config/outpost/config.toml`).
    pub fn start_configured(config: &str) -> McpHttp {
        McpHttp::launch(&[], None, Some(config), &[], &[])
    }

    /// The same with `env` set for the server (and so its local agent).
    pub fn start_with_env(env: &[(&str, String)]) -> McpHttp {
        McpHttp::launch(&[], None, None, env, &[])
    }

    /// The same behind a TLS proxy at `url` (`--public-url`).
    pub fn start_public(url: &str) -> McpHttp {
        McpHttp::launch(&[], None, None, &[], &["--public-url", url])
    }

    fn launch(
        callers: &[(&str, &str)],
        nofile: Option<u32>,
        config: Option<&str>,
        env: &[(&str, String)],
        args: &[&str],
    ) -> McpHttp {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        let home = TempDir::new("http-home");
        if let Some(config) = config {
            let dir = home.path().join(".config/outpost");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("config.toml"), config).unwrap();
        }
        if !callers.is_empty() {
            let dir = home.path().join(".outpost/http-tokens");
            fs::create_dir_all(&dir).unwrap();
            for (name, token) in callers {
                let path = dir.join(name);
                fs::write(&path, token).unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        let mut command = match nofile {
            // prlimit execs the command: the child's pid is the server's.
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(target_bin("outpost"));
                c
            }
            None => Command::new(target_bin("outpost")),
        };
        let mut child = command
            .args(["mcp", "--http", "127.0.0.1:0"])
            .args(args)
            .current_dir(std::env::temp_dir())
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn outpost mcp --http");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut listening = None;
        let config: serde_json::Value = loop {
            let line = lines.next().expect("outpost mcp --http exited").unwrap();
            if let Some((_, rest)) = line.split_once("listening on ") {
                listening = rest.split([' ', ')', ';']).next().map(str::to_string);
            }
            if line.starts_with('{') {
                break serde_json::from_str(&line).unwrap();
            }
        };
        // Keep draining stderr so that the server never blocks on it; count
        // what it writes.
        let logged = Arc::new(AtomicU64::new(0));
        let approval = Arc::new(Mutex::new(String::new()));
        let (count, latest) = (logged.clone(), approval.clone());
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                count.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
                if let Some(code) = line
                    .split_once("OAuth approval code: ")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                {
                    *latest.lock().unwrap() = code.to_string();
                }
            }
        });
        let addr = match listening {
            // Behind a proxy the lines name the public URL.
            Some(addr) => addr,
            None => config["url"]
                .as_str()
                .unwrap()
                .strip_prefix("http://")
                .and_then(|u| u.strip_suffix("/mcp"))
                .unwrap()
                .to_string(),
        };
        let token = config["headers"]["Authorization"]
            .as_str()
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap()
            .to_string();
        McpHttp {
            child,
            addr,
            token,
            home,
            logged,
            approval,
        }
    }

    /// The latest OAuth approval code the server printed (waits for the
    /// first, at most 10 s).
    pub fn approval_code(&self) -> String {
        let found = crate::wait_until(Duration::from_secs(10), || {
            !self.approval.lock().unwrap().is_empty()
        });
        assert!(found, "the server printed no OAuth approval code");
        self.approval.lock().unwrap().clone()
    }

    /// A grant made through the server's OAuth records as its token
    /// endpoint makes one, for `resource`: the client's id and an access
    /// token (the browser sign-in itself is the oauth test's).
    pub fn oauth_grant(&self, resource: &str) -> (String, String) {
        let grants = outpost::ops::grants::Grants::new(&self.home.path().join(".outpost"));
        let client = grants
            .register("test client", vec!["https://client.example.test/cb".into()])
            .unwrap();
        let issued = grants
            .issue(&client.id, "owner", "mcp", resource, "test-code")
            .unwrap();
        (client.id, issued.access)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An MCP client over Streamable HTTP with the token.
    pub async fn client<H: rmcp::ClientHandler>(
        &self,
        handler: H,
    ) -> rmcp::service::RunningService<rmcp::RoleClient, H> {
        self.client_with_token(handler, &self.token).await
    }

    /// The same with another bearer token (an OAuth access token).
    pub async fn client_with_token<H: rmcp::ClientHandler>(
        &self,
        handler: H,
        token: &str,
    ) -> rmcp::service::RunningService<rmcp::RoleClient, H> {
        use rmcp::ServiceExt;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let config =
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(token.to_string());
        handler
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("MCP handshake over HTTP")
    }
}

impl Drop for McpHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
