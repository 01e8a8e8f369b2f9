//! HTTP answers the server's own pages and endpoints share (OAuth, the
//! status page): never cached, and pages that cannot be framed and run
//! nothing from another site.

use std::convert::Infallible;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

pub type Body = BoxBody<Bytes, Infallible>;

pub fn bare(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

pub fn with_body(status: StatusCode, body: String, kind: &'static str) -> Response<Body> {
    let mut response = bare(status);
    *response.body_mut() = Full::new(Bytes::from(body)).boxed();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

pub fn text(status: StatusCode, body: &str) -> Response<Body> {
    with_body(status, body.to_string(), "text/plain; charset=utf-8")
}

pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    with_body(status, value.to_string(), "application/json")
}

/// An HTML page under `policy` (its Content-Security-Policy, which ends
/// with `frame-ancestors 'none'`), sending no referrer.
pub fn page(status: StatusCode, html: String, policy: &'static str) -> Response<Body> {
    let mut response = with_body(status, html, "text/html; charset=utf-8");
    let headers = response.headers_mut();
    headers.insert("content-security-policy", HeaderValue::from_static(policy));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}
