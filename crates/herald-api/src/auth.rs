use std::collections::HashMap;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

use crate::problem::Problem;

/// Bearer tokens and the caller each one authenticates.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    callers: HashMap<String, String>,
}

impl Tokens {
    /// Parses `token:caller,token:caller` (the `HERALD_API_TOKENS` format).
    pub fn parse(spec: &str) -> Result<Tokens, String> {
        let mut callers = HashMap::new();
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (token, caller) = pair
                .split_once(':')
                .filter(|(t, c)| !t.is_empty() && !c.is_empty())
                .ok_or_else(|| format!("token entry `{pair}` is not token:caller"))?;
            callers.insert(token.to_owned(), caller.to_owned());
        }
        if callers.is_empty() {
            return Err("no API tokens configured".into());
        }
        Ok(Tokens { callers })
    }

    pub fn single(token: &str, caller: &str) -> Tokens {
        Tokens { callers: HashMap::from([(token.to_owned(), caller.to_owned())]) }
    }

    /// The caller behind the request's bearer token, or 401.
    pub fn caller(&self, headers: &HeaderMap) -> Result<String, Problem> {
        let value = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Problem::unauthorized("missing Authorization: Bearer <token>"))?;
        let token = value.strip_prefix("Bearer ").ok_or_else(|| Problem::unauthorized("Authorization must be `Bearer <token>`"))?;
        self.callers.get(token.trim()).cloned().ok_or_else(|| Problem::unauthorized("unknown token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_and_rejects_malformed_entries() {
        let tokens = Tokens::parse("t1:alice, t2:bob").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "Bearer t2".parse().unwrap());
        assert_eq!(tokens.caller(&headers).unwrap(), "bob");
        assert!(Tokens::parse("t1").is_err());
        assert!(Tokens::parse(":alice").is_err());
        assert!(Tokens::parse("").is_err());
    }

    #[test]
    fn unknown_or_missing_token_is_unauthorized() {
        let tokens = Tokens::single("t1", "alice");
        let mut headers = HeaderMap::new();
        assert_eq!(tokens.caller(&headers).unwrap_err().status.as_u16(), 401);
        headers.insert(AUTHORIZATION, "Bearer nope".parse().unwrap());
        assert_eq!(tokens.caller(&headers).unwrap_err().status.as_u16(), 401);
    }
}
