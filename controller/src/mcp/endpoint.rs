//! Where the HTTP server is: the path it serves, the address it listens
//! on (`--http`) and the public URL a TLS proxy gives it (`--public-url`).

use std::net::{Ipv4Addr, SocketAddr};

/// Where `outpost mcp --http` listens when given no address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8742";
/// The one path served.
pub const PATH: &str = "/mcp";

/// `--http`'s value: `ADDR:PORT`, `localhost:PORT`, or a bare `PORT` on
/// 127.0.0.1.
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let port = text
        .strip_prefix("localhost:")
        .unwrap_or(text)
        .parse::<u16>()
        .map_err(|_| format!("`{text}` is not ADDR:PORT, localhost:PORT or PORT"))?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// `--public-url`: where clients reach this server through a TLS proxy.
#[derive(Debug, Clone)]
pub struct PublicUrl {
    /// `https://HOST[:PORT]`, no path.
    pub base: String,
    /// `HOST[:PORT]`, as the proxy passes it in `Host`.
    pub authority: String,
    pub host: String,
}

/// `--public-url`'s value: an https URL with a host and no path.
pub fn parse_public_url(text: &str) -> Result<PublicUrl, String> {
    let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    let host = url.host_str().unwrap_or_default().to_string();
    if url.scheme() != "https" || host.is_empty() || url.path() != "/" || url.query().is_some() {
        return Err(format!(
            "`{text}`: give the https URL of the proxy in front of this server, with no path (e.g. https://outpost.example.org)"
        ));
    }
    let authority = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.clone(),
    };
    Ok(PublicUrl {
        base: format!("https://{authority}"),
        authority,
        host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_may_name_localhost_or_only_a_port() {
        let ok = |s: &str| parse_listen_addr(s).unwrap().to_string();
        assert_eq!(ok("127.0.0.1:9000"), "127.0.0.1:9000");
        assert_eq!(ok("[::1]:9000"), "[::1]:9000");
        assert_eq!(ok("localhost:9000"), "127.0.0.1:9000");
        assert_eq!(ok("9000"), "127.0.0.1:9000");
        let err = parse_listen_addr("example.org:9000").unwrap_err();
        assert!(err.contains("ADDR:PORT"), "{err}");
    }

    #[test]
    fn a_public_url_is_https_with_no_path() {
        let public = parse_public_url("https://Outpost.Example.org:8443").unwrap();
        assert_eq!(public.base, "https://outpost.example.org:8443");
        assert_eq!(public.host, "outpost.example.org");
        for bad in [
            "http://outpost.example.org",
            "https://x.example/mcp",
            "outpost",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
    }
}
