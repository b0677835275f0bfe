//! HTTP basic auth for the agent's listeners: bcrypt hashes from the web config, checked
//! at a bounded cost.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
};

use axum::http::{HeaderMap, header};
use base64::Engine as _;

/// The basic-auth users. bcrypt makes each check cost tens of milliseconds of CPU, so a
/// successful check is remembered (as an HMAC of the credentials under a key of this
/// process, never the password itself) and failures go through a gate of two at a time.
pub(crate) struct BasicAuth {
    users: HashMap<String, String>,
    cache_key: ring::hmac::Key,
    verified: Mutex<HashSet<Vec<u8>>>,
    gate: tokio::sync::Semaphore,
}

/// Successful credentials remembered at most (then forgotten all at once).
const AUTH_CACHE: usize = 256;

impl BasicAuth {
    pub(crate) fn new(users: BTreeMap<String, String>) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let cache_key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .unwrap_or_else(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"node-diag"));
        Self {
            users: users.into_iter().collect(),
            cache_key,
            verified: Mutex::new(HashSet::new()),
            gate: tokio::sync::Semaphore::new(2),
        }
    }

    /// Whether the request's `Authorization: Basic` credentials name a user with that
    /// password.
    pub(crate) async fn allows(self: &Arc<Self>, headers: &HeaderMap) -> bool {
        let Some((user, password)) = credentials(headers) else {
            return false;
        };
        let tag = ring::hmac::sign(&self.cache_key, format!("{user}\0{password}").as_bytes());
        let tag = tag.as_ref().to_vec();
        if self.cache().contains(&tag) {
            return true;
        }
        let Ok(_permit) = self.gate.acquire().await else {
            return false;
        };
        let this = Arc::clone(self);
        let ok = tokio::task::spawn_blocking(move || this.verify(&user, &password))
            .await
            .unwrap_or(false);
        if ok {
            let mut cache = self.cache();
            if cache.len() >= AUTH_CACHE {
                cache.clear();
            }
            cache.insert(tag);
        }
        ok
    }

    /// bcrypt's check; an unknown user costs one too (against another user's hash), so
    /// that the time taken does not tell which users exist.
    pub(crate) fn verify(&self, user: &str, password: &str) -> bool {
        match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                if let Some(hash) = self.users.values().next() {
                    let _ = bcrypt::verify(password, hash);
                }
                false
            }
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashSet<Vec<u8>>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `(user, password)` of an `Authorization: Basic` header.
pub(super) fn credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn hash(password: &str) -> String {
        bcrypt::hash(password, 4).unwrap()
    }

    #[test]
    fn basic_credentials_are_decoded() {
        let mut headers = HeaderMap::new();
        assert_eq!(credentials(&headers), None);
        // alice:pa:ss
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic YWxpY2U6cGE6c3M="),
        );
        assert_eq!(
            credentials(&headers),
            Some(("alice".to_owned(), "pa:ss".to_owned()))
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer YWxpY2U6cGE6c3M="),
        );
        assert_eq!(credentials(&headers), None);
    }

    #[tokio::test]
    async fn a_successful_check_is_remembered_and_a_wrong_one_is_not() {
        let users = BTreeMap::from([("alice".to_owned(), hash("wonderland"))]);
        let auth = Arc::new(BasicAuth::new(users));
        let header = |v: &str| {
            let mut h = HeaderMap::new();
            let encoded = base64::engine::general_purpose::STANDARD.encode(v);
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Basic {encoded}")).unwrap(),
            );
            h
        };
        assert!(!auth.allows(&header("alice:nope")).await);
        assert!(auth.cache().is_empty());
        assert!(auth.allows(&header("alice:wonderland")).await);
        assert_eq!(auth.cache().len(), 1);
        assert!(auth.allows(&header("alice:wonderland")).await);
        assert!(!auth.allows(&HeaderMap::new()).await);
    }
}
