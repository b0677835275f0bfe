//! How `node-diag findings` reaches an agent: plain HTTP, or HTTPS with the agent's CA,
//! a client certificate and a server name, and optionally basic auth (the agent's web
//! config, exporter-toolkit format, decides which it requires).
//!
//! TLS is rustls (ring) through ureq. `--tls-server-name` is the name the agent's
//! certificate is checked against and sent as SNI: ureq verifies the URL's host, so the
//! request goes to `https://NAME:PORT` and a resolver pinned to the agent's address
//! makes the connection (one certificate for a Service name serves every node, whose
//! addresses need not be in it).

use std::{
    collections::HashMap,
    fmt, fs,
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use ureq::{
    config::Config,
    http::Uri,
    tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig},
    unversioned::{
        resolver::{ResolvedSocketAddrs, Resolver},
        transport::{DefaultConnector, NextTimeout},
    },
};

use super::{CONNECT_TIMEOUT, ClientError, TIMEOUT};

/// The TLS and authentication flags of `node-diag findings`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TransportOptions {
    /// `--tls-ca`: the CA that signed the agents' certificates.
    pub(crate) ca: Option<PathBuf>,
    /// `--tls-cert`, `--tls-key`: the client certificate and its key.
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    /// `--tls-server-name`: the name the agents' certificates are checked against.
    pub(crate) server_name: Option<String>,
    /// `--basic-auth-user` and the password read from `--basic-auth-password-file`.
    pub(crate) basic_auth: Option<(String, PathBuf)>,
}

impl TransportOptions {
    /// Whether any TLS flag was given: servers without a scheme are then `https://`.
    pub(crate) fn tls(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TransportError {
    #[error("cannot read {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    #[error("{path} holds no PEM {what}")]
    Pem { what: &'static str, path: PathBuf },
    #[error("TLS needs --tls-ca: the CA that signed the agents' certificates")]
    NoCa,
    #[error("--tls-cert and --tls-key go together")]
    HalfCert,
    #[error("the password file {0} is empty")]
    EmptyPassword(PathBuf),
}

/// The TLS setup and credentials, read once; [`Client::get_raw`] makes each request.
#[derive(Clone)]
pub(crate) struct Client {
    tls: Option<TlsConfig>,
    server_name: Option<String>,
    /// The `Authorization` header's value.
    authorization: Option<String>,
    /// Whether a client certificate is presented (an error says to give one if not).
    has_cert: bool,
    /// One ureq agent per server, kept across polls: `--follow` reuses its kept-alive
    /// connection instead of a new TCP and TLS handshake every second (and a TLS
    /// connection dropped without `close_notify`, as ureq drops it, every second).
    agents: Arc<Mutex<HashMap<String, ureq::Agent>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("tls", &self.tls.is_some())
            .field("server_name", &self.server_name)
            .field("basic_auth", &self.authorization.is_some())
            .finish()
    }
}

fn read(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, TransportError> {
    fs::read(path).map_err(|cause| TransportError::Read {
        what,
        path: path.clone(),
        cause,
    })
}

impl Client {
    /// Plain HTTP, no credentials.
    pub(crate) fn plain() -> Client {
        Client {
            tls: None,
            server_name: None,
            authorization: None,
            has_cert: false,
            agents: Arc::default(),
        }
    }

    /// Reads the files the flags name.
    pub(crate) fn new(opts: &TransportOptions) -> Result<Client, TransportError> {
        let authorization = match &opts.basic_auth {
            None => None,
            Some((user, file)) => {
                let text = read("the password file", file)?;
                let text = String::from_utf8_lossy(&text);
                // Files written by `echo` end with a newline that is not the password's.
                let password = text.trim_end_matches(['\n', '\r']);
                if password.is_empty() {
                    return Err(TransportError::EmptyPassword(file.clone()));
                }
                use base64::Engine as _;
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Some(format!("Basic {token}"))
            }
        };
        if opts.cert.is_some() != opts.key.is_some() {
            return Err(TransportError::HalfCert);
        }
        if !opts.tls() {
            return Ok(Client {
                authorization,
                ..Client::plain()
            });
        }
        let roots = match &opts.ca {
            Some(path) => {
                let pem = read("the CA file", path)?;
                let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(TransportError::Pem {
                        what: "certificate",
                        path: path.clone(),
                    });
                }
                RootCerts::new_with_certs(&certs)
            }
            // No bundled roots: the agents' certificates come from the cluster's own CA,
            // which no public root store holds.
            None => return Err(TransportError::NoCa),
        };
        let client_cert = match (&opts.cert, &opts.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let pem = read("the client certificate", cert)?;
                let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if chain.is_empty() {
                    return Err(TransportError::Pem {
                        what: "certificate",
                        path: cert.clone(),
                    });
                }
                let pem = read("the client key", key)?;
                let key = PrivateKey::from_pem(&pem).map_err(|_| TransportError::Pem {
                    what: "private key",
                    path: key.clone(),
                })?;
                Some(ClientCert::new_with_certs(&chain, key))
            }
            _ => return Err(TransportError::HalfCert),
        };
        let has_cert = client_cert.is_some();
        // ring, as the agent's listeners use (deprecated by rustls for lacking
        // post-quantum key exchange; aws-lc-rs needs cmake and a C cross toolchain).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = TlsConfig::builder()
            .root_certs(roots)
            .client_cert(client_cert)
            .unversioned_rustls_crypto_provider(provider)
            .build();
        Ok(Client {
            tls: Some(tls),
            server_name: opts.server_name.clone(),
            authorization,
            has_cert,
            agents: Arc::default(),
        })
    }

    /// The scheme of a server given without one.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// `scheme://authority` of `server` (`HOST:PORT`, `http://HOST:PORT` or
    /// `https://HOST:PORT`, any path ignored).
    pub(crate) fn base(&self, server: &str) -> Result<(&'static str, String), ClientError> {
        let (scheme, rest) = if let Some(rest) = server.strip_prefix("https://") {
            ("https", rest)
        } else if let Some(rest) = server.strip_prefix("http://") {
            ("http", rest)
        } else if server.contains("://") {
            return Err(ClientError::Url(server.to_string()));
        } else {
            (self.scheme(), server)
        };
        let auth = rest.split('/').next().unwrap_or("");
        if auth.is_empty() || !auth.contains(':') {
            return Err(ClientError::Url(server.to_string()));
        }
        if scheme == "http" && self.tls.is_some() {
            return Err(ClientError::PlainWithTls(server.to_string()));
        }
        Ok((scheme, auth.to_string()))
    }

    /// `GET path` on `server`: ureq's response, any status.
    pub(crate) fn get_raw(
        &self,
        server: &str,
        path: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, ClientError> {
        let (scheme, auth) = self.base(server)?;
        let target = match (&self.server_name, scheme) {
            (Some(name), "https") => {
                let port = auth.rsplit(':').next().unwrap_or("443");
                format!("https://{name}:{port}{path}")
            }
            _ => format!("{scheme}://{auth}{path}"),
        };
        let key = format!("{scheme}://{auth}");
        let cached = self
            .agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let agent = match cached {
            Some(agent) => agent,
            None => {
                let agent = self.agent(server, scheme, &auth)?;
                self.agents
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, agent.clone());
                agent
            }
        };
        let mut request = agent.get(&target);
        if let Some(value) = &self.authorization {
            request = request.header("Authorization", value);
        }
        request
            .call()
            .map_err(|e| ClientError::connect(server, e, self.tls.is_some() && !self.has_cert))
    }

    /// A ureq agent for `scheme://auth`: with `--tls-server-name`, one whose URLs name
    /// the server name and whose resolver gives `auth`'s address.
    fn agent(&self, server: &str, scheme: &str, auth: &str) -> Result<ureq::Agent, ClientError> {
        let mut config = Config::builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false);
        if let Some(tls) = &self.tls {
            config = config.tls_config(tls.clone());
        }
        let config = config.build();
        Ok(match (&self.server_name, scheme) {
            (Some(_), "https") => {
                let addrs: Vec<SocketAddr> = auth
                    .to_socket_addrs()
                    .map_err(|cause| ClientError::Connect {
                        url: server.to_string(),
                        cause: Box::new(cause),
                    })?
                    .collect();
                ureq::Agent::with_parts(config, DefaultConnector::new(), Pinned(addrs))
            }
            _ => ureq::Agent::new_with_config(config),
        })
    }
}

/// Resolves every name to the agent's addresses: the URL names the certificate's
/// server name, the connection goes to the agent.
#[derive(Debug)]
struct Pinned(Vec<SocketAddr>);

impl Resolver for Pinned {
    fn resolve(
        &self,
        _uri: &Uri,
        _config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut out = self.empty();
        for a in self.0.iter().take(16) {
            out.push(*a);
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_without_a_scheme_are_https_when_tls_is_configured() {
        let plain = Client::plain();
        assert_eq!(
            plain.base("10.0.0.1:9465").unwrap(),
            ("http", "10.0.0.1:9465".to_string())
        );
        assert_eq!(
            plain.base("https://[fd00::1]:9464/x").unwrap(),
            ("https", "[fd00::1]:9464".to_string())
        );
        assert!(plain.base("ftp://a:1").is_err());
        assert!(plain.base("http://host").is_err());
        let tls = Client {
            tls: Some(TlsConfig::builder().build()),
            ..Client::plain()
        };
        assert_eq!(
            tls.base("10.0.0.1:9464").unwrap(),
            ("https", "10.0.0.1:9464".to_string())
        );
        assert!(matches!(
            tls.base("http://10.0.0.1:9464"),
            Err(ClientError::PlainWithTls(_))
        ));
    }

    #[test]
    fn a_key_without_its_certificate_is_refused() {
        let opts = TransportOptions {
            ca: Some("/dev/null".into()),
            key: Some("/nonexistent.key".into()),
            ..TransportOptions::default()
        };
        assert!(matches!(Client::new(&opts), Err(TransportError::HalfCert)));
    }
}
