//! The consent page: which client asks for what, and the field for the
//! owner's proof. Plain HTML with its style inline and no script, so it
//! needs nothing but this server; it may not be framed (against
//! clickjacking).

use std::fmt::Write;

/// What the page shows of one authorization request.
pub struct Ask<'a> {
    /// The pending request's id, posted back.
    pub request: &'a str,
    pub client_name: &'a str,
    pub client_id: &'a str,
    pub redirect_uri: &'a str,
    pub scope: &'a str,
    /// Said above the form after a wrong proof.
    pub problem: Option<&'a str>,
}

const STYLE: &str = "body{font:16px system-ui,sans-serif;max-width:34rem;margin:3rem auto;padding:0 1rem;color:#1d2330}\
h1{font-size:1.4rem}dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem}dt{color:#5a6272}\
dd{margin:0;word-break:break-all}input[type=password]{width:100%;font:inherit;padding:.4rem;box-sizing:border-box}\
.problem{color:#a4161a;font-weight:600}button{font:inherit;padding:.45rem 1.1rem;margin:.8rem .5rem 0 0}\
.note{color:#5a6272;font-size:.9rem}";

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

pub fn page(ask: &Ask<'_>) -> String {
    let mut html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Outpost: approve {name}</title>\
         <meta name=viewport content='width=device-width'><style>{STYLE}</style></head><body>\
         <h1>Let <q id=client>{name}</q> use Outpost?</h1>\
         <p>It will be able to run commands and read and write files on the hosts this Outpost server reaches, as you.</p>\
         <dl><dt>client id</dt><dd>{id}</dd><dt>returns to</dt><dd>{uri}</dd><dt>scope</dt><dd>{scope}</dd></dl>",
        name = escape(ask.client_name),
        id = escape(ask.client_id),
        uri = escape(ask.redirect_uri),
        scope = escape(ask.scope),
    );
    if let Some(problem) = ask.problem {
        let _ = write!(html, "<p class=problem role=alert>{}</p>", escape(problem));
    }
    let _ = write!(
        html,
        "<form method=post action=/authorize>\
         <input type=hidden name=request value='{request}'>\
         <label for=proof>Approval code shown where <code>outpost mcp --http</code> runs (or its bearer token)</label>\
         <input type=password id=proof name=proof autocomplete=off autofocus>\
         <button name=decision value=approve>Approve</button><button name=decision value=deny>Deny</button>\
         </form><p class=note>Each code works once; the server prints the next one. \
         Grants are listed by <code>outpost auth list</code> and ended by <code>outpost auth revoke</code>.</p>\
         </body></html>",
        request = escape(ask.request),
    );
    html
}

/// A page that says why a request cannot go on (no redirect: the client
/// or its return address could not be trusted).
pub fn refusal(problem: &str) -> String {
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Outpost: sign-in refused</title>\
         <style>{STYLE}</style></head><body><h1>This sign-in cannot go on</h1>\
         <p class=problem role=alert>{}</p></body></html>",
        escape(problem)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_client_names_itself_is_shown_as_text() {
        let html = page(&Ask {
            request: "r1",
            client_name: "<script>alert(1)</script>' onmouseover='x",
            client_id: "c1",
            redirect_uri: "http://127.0.0.1:9/cb?a=1&b=2",
            scope: "mcp",
            problem: Some("wrong <code>"),
        });
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&#39; onmouseover=&#39;x"));
        assert!(html.contains("a=1&amp;b=2"));
        assert!(html.contains("wrong &lt;code&gt;"));
    }
}
