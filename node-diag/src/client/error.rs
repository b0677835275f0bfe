//! What `node-diag findings` says when it cannot: each failure named by what the user
//! can change (the URL, the TLS flags, the agent), with its cause.

use std::io;

use super::{cluster::ClusterError, transport::TransportError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("bad server URL {0:?}: expected HOST:PORT, http://HOST:PORT or https://HOST:PORT")]
    Url(String),
    #[error("{0:?} is plain http:// but TLS flags were given: use https:// or no scheme")]
    PlainWithTls(String),
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The TLS handshake failed: the agent's certificate, name or CA, or its refusal.
    #[error("TLS with the agent at {url} failed (see --tls-ca, --tls-server-name)")]
    Tls {
        url: String,
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The agent ended the TLS handshake because no client certificate was presented.
    #[error("the agent at {url} requires a client certificate: give --tls-cert and --tls-key")]
    ClientCertRequired {
        url: String,
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot reach the agent at {url} (is `node-diag run` running? see --server)")]
    Connect {
        url: String,
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the agent at {url} answered {status}")]
    Status { url: String, status: u16 },
    /// A 400: the agent's one-line message says which parameter it refused.
    #[error("the agent at {url} refused the query: {message}")]
    Rejected { url: String, message: String },
    #[error("the agent at {url} sent findings node-diag cannot parse")]
    Parse {
        url: String,
        #[source]
        cause: serde_json::Error,
    },
    #[error("writing the findings")]
    Write(#[source] io::Error),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// `--cluster`: every agent failed; each is named with its cause.
    #[error("no agent of {name} answered: {}", .agents.join("; "))]
    NoneAnswered { name: String, agents: Vec<String> },
}

impl ClientError {
    /// `no_cert`: TLS without a client certificate, so that a refusal for the lack of
    /// one is said as such.
    pub(super) fn connect(url: &str, e: ureq::Error, no_cert: bool) -> ClientError {
        let tls = match &e {
            ureq::Error::Rustls(_) => true,
            ureq::Error::Io(io) => io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
            _ => false,
        };
        let cause: Box<dyn std::error::Error + Send + Sync> = match e {
            // Its own text only ("Connection refused (os error 111)"), not ureq's "io: ".
            ureq::Error::Io(io) => Box::new(io),
            other => Box::new(other),
        };
        // rustls' alert from a server requiring a certificate: `CertificateRequired`
        // under TLS 1.3, a handshake failure under 1.2.
        let text = describe(cause.as_ref());
        if no_cert
            && ["CertificateRequired", "HandshakeFailure"]
                .iter()
                .any(|alert| text.contains(alert))
        {
            return ClientError::ClientCertRequired {
                url: url.to_string(),
                cause,
            };
        }
        if tls {
            return ClientError::Tls {
                url: url.to_string(),
                cause,
            };
        }
        ClientError::Connect {
            url: url.to_string(),
            cause,
        }
    }
}

/// An error and its causes, `: `-separated.
pub(super) fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
