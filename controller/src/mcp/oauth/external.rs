//! An external authorization server, for teams that have one: access
//! tokens are JWTs signed by its keys (the JWKS file `[oauth]` names),
//! issued by it (`iss`), for this server (`aud`: `[oauth] audience`, else
//! the MCP URL the request reached), not expired. The subject is `sub`,
//! the client `client_id` or `azp`. Only asymmetric algorithms are
//! accepted: with a shared secret, whoever reads the config could mint
//! tokens.

use anyhow::{Context, bail};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::ExternalOauth;
use crate::ops::grants::Invalid;

const ASYMMETRIC: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// Clock difference allowed between the issuer and this machine.
const LEEWAY_S: u64 = 30;

pub struct External {
    issuer: String,
    audience: Option<String>,
    keys: JwkSet,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    client_id: Option<String>,
    azp: Option<String>,
}

impl External {
    /// The issuer and its keys, or what is wrong with them.
    pub fn load(config: &ExternalOauth) -> anyhow::Result<External> {
        let text = std::fs::read_to_string(&config.jwks)
            .with_context(|| format!("[oauth] jwks: cannot read {}", config.jwks.display()))?;
        let keys: JwkSet = serde_json::from_str(&text).with_context(|| {
            format!(
                "[oauth] jwks: {} is not a JWKS ({{\"keys\": […]}})",
                config.jwks.display()
            )
        })?;
        if keys.keys.is_empty() {
            bail!("[oauth] jwks: {} holds no keys", config.jwks.display());
        }
        let issuer = config.issuer.trim_end_matches('/').to_string();
        let secure = issuer.starts_with("https://")
            || issuer.starts_with("http://127.0.0.1")
            || issuer.starts_with("http://localhost");
        if !secure {
            bail!("[oauth] issuer must be an https URL (or http on loopback), got {issuer:?}");
        }
        Ok(External {
            issuer,
            audience: config.audience.clone(),
            keys,
        })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The subject and client a token names, if it is valid here.
    pub fn verify(&self, token: &str, resource: &str) -> Result<(String, String), Invalid> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Invalid::Unknown)?;
        if !ASYMMETRIC.contains(&header.alg) {
            return Err(Invalid::Unknown);
        }
        let jwk = match &header.kid {
            Some(kid) => self.keys.find(kid),
            None if self.keys.keys.len() == 1 => self.keys.keys.first(),
            None => None,
        }
        .ok_or(Invalid::Unknown)?;
        // A key that names its algorithm or use is taken only for those.
        let alg_differs = jwk
            .common
            .key_algorithm
            .is_some_and(|k| format!("{k:?}") != format!("{:?}", header.alg));
        let not_for_signing = jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature);
        if alg_differs || not_for_signing {
            return Err(Invalid::Unknown);
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| Invalid::Unknown)?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_S;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer, &format!("{}/", self.issuer)]);
        validation.set_audience(&[self.audience.as_deref().unwrap_or(resource)]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
            Ok(data) => {
                let claims = data.claims;
                let client = claims
                    .client_id
                    .or(claims.azp)
                    .unwrap_or_else(|| "external".into());
                Ok((claims.sub, client))
            }
            Err(e) => Err(match e.kind() {
                ErrorKind::ExpiredSignature => Invalid::Expired,
                ErrorKind::InvalidAudience => Invalid::Audience,
                _ => Invalid::Unknown,
            }),
        }
    }
}
