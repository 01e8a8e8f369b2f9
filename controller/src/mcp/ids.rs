//! Ids a caller may send as strings or, as remote-sandbox-mcp's clients do
//! (its job watches and transfers are numbered), as integers.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};

/// A job, watch or transfer id. remote-sandbox-mcp's default `0` means none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id(String);

impl Id {
    /// The id, unless it is empty or `0`.
    pub fn given(&self) -> Option<&str> {
        let id = self.0.trim();
        (!id.is_empty() && id != "0").then_some(id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(i64),
        }
        Ok(Id(
            match Raw::deserialize(deserializer)
                .map_err(|_| serde::de::Error::custom("expected an id (a string or an integer)"))?
            {
                Raw::Text(s) => s,
                Raw::Number(n) => n.to_string(),
            },
        ))
    }
}

impl JsonSchema for Id {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Id".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": ["string", "integer"]})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_integers() {
        let id: Id = serde_json::from_value(serde_json::json!(7)).unwrap();
        assert_eq!(id.given(), Some("7"));
        let id: Id = serde_json::from_value(serde_json::json!("job-1")).unwrap();
        assert_eq!(id.given(), Some("job-1"));
        let none: Id = serde_json::from_value(serde_json::json!(0)).unwrap();
        assert_eq!(none.given(), None);
        assert!(serde_json::from_value::<Id>(serde_json::json!(true)).is_err());
    }
}
