//! `node-diag findings`: reads a running agent's `/findings` over HTTP/1.1 (ureq), plain
//! or over TLS with a client certificate and basic auth, and prints them, optionally
//! following them as they appear, grow and end.
//!
//! - [`transport`]: the TLS and authentication flags, and each request.
//! - [`query`]: the filters, sent as query parameters and applied again to the answer
//!   (an older agent ignores them).
//! - [`follow`]: each finding's identity (its store entry) and what changed between two
//!   polls.
//! - [`cluster`]: `--cluster NAME`, every agent behind a headless Service, asked
//!   concurrently; their answers are merged into one stream with a node column, and an
//!   agent that does not answer is named while the others are still shown.
//! - [`join`]: in that merged view, a client's unexplained `tcp_timeout` on one node and
//!   another node's inbound drop of the same connect's SYNs become one finding.
//!
//! Without `--follow` it prints every matching finding (up to the agent's limit, saying
//! on stderr when the answer was cut); with it, the last `--last` ones and then every
//! change. Each finding is printed through `crate::output`: compact, wide or its JSON as
//! the agent sent it.

pub(crate) mod cluster;
mod error;
pub(crate) mod follow;
pub(crate) mod join;
pub(crate) mod query;
pub(crate) mod transport;

use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Write},
    net::SocketAddr,
    time::{Duration, SystemTime},
};

use serde::Deserialize as _;

pub(crate) use self::error::ClientError;
use self::{
    cluster::{Cluster, Member},
    error::describe,
    follow::{Change, Tracker},
    query::{Filters, MAX_LIMIT},
    transport::Client,
};
use crate::{
    findings::Finding,
    output::{self, FindingsFormat},
};

/// Where `/findings` is served: the agent's loopback findings listener.
/// `http://`, or `https://` when TLS flags are given.
pub(crate) const DEFAULT_SERVER: &str = "127.0.0.1:9465";
/// Where agents without a findings listener served it, tried when the default is not
/// answered and no `--server` was given.
const LEGACY_SERVER: &str = "http://127.0.0.1:9464";
/// Bound on connecting to the agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on the whole request, connect to last body byte.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `/findings` answer read.
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// Exit status of `node-diag findings --cluster` when some agents did not answer (the
/// others' findings printed).
pub(crate) const EXIT_SOME_UNREACHABLE: u8 = 3;

/// One answer of the agent: its body and the headers that say whether it was cut.
pub(crate) struct Answer {
    pub(crate) body: String,
    /// `X-Node-Diag-Total`: the findings matching before the limit.
    pub(crate) total: Option<usize>,
    /// `X-Node-Diag-Truncated: true`.
    pub(crate) truncated: bool,
}

/// `GET path` on the agent at `url`: the body of a `200` answer, decoded (chunked or not)
/// as bytes before it is read as UTF-8 text.
fn get(client: &Client, url: &str, path: &str) -> Result<Answer, ClientError> {
    let mut response = client.get_raw(url, path)?;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let total = header("x-node-diag-total").and_then(|t| t.trim().parse().ok());
    let truncated = header("x-node-diag-truncated").is_some_and(|t| t.trim() == "true");
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_string();
    match status {
        200 => Ok(Answer {
            body: body.map_err(|e| ClientError::connect(url, e, false))?,
            total,
            truncated,
        }),
        400 => {
            let message = body.unwrap_or_default();
            let message = message.lines().next().unwrap_or("").trim();
            Err(ClientError::Rejected {
                url: url.to_string(),
                message: if message.is_empty() {
                    "400 Bad Request".to_string()
                } else {
                    message.to_string()
                },
            })
        }
        status => Err(ClientError::Status {
            url: url.to_string(),
            status,
        }),
    }
}

/// A finding as an agent served it: typed for printing, and as sent, for `-o json` and
/// the fields this client does not model.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub(crate) finding: Finding,
    pub(crate) raw: serde_json::Value,
    /// The agent's identity of its store entry (agents from before it send none).
    pub(crate) id: Option<String>,
    /// The node whose agent made it (agents from before it send none).
    pub(crate) node: Option<String>,
}

impl Fetched {
    fn from_value(raw: serde_json::Value) -> Result<Fetched, serde_json::Error> {
        let text = |k: &str| match raw.get(k) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let (id, node) = (text("id"), text("node"));
        let finding = Finding::deserialize(&raw)?;
        Ok(Fetched {
            finding,
            raw,
            id,
            node,
        })
    }

    #[cfg(test)]
    pub(crate) fn from_finding(finding: Finding) -> Fetched {
        Fetched {
            raw: serde_json::to_value(&finding).unwrap(),
            finding,
            id: None,
            node: None,
        }
    }
}

/// Reads a `/findings` body.
pub(crate) fn parse_findings(body: &str) -> Result<Vec<Fetched>, serde_json::Error> {
    let values: Vec<serde_json::Value> = serde_json::from_str(body)?;
    values.into_iter().map(Fetched::from_value).collect()
}

/// What `node-diag findings` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `--server`; `None` tries [`DEFAULT_SERVER`], then [`LEGACY_SERVER`].
    pub(crate) server: Option<String>,
    pub(crate) follow: bool,
    /// `--last N`: how many of the most recent to print first (`None`: all without
    /// `--follow`, [`DEFAULT_FOLLOW_LAST`] with it).
    pub(crate) last: Option<usize>,
    pub(crate) filters: Filters,
    pub(crate) format: FindingsFormat,
    pub(crate) color: bool,
    pub(crate) poll: Duration,
    /// `--cluster`: every agent behind a headless Service instead of `server`.
    pub(crate) cluster: Option<Cluster>,
    /// TLS and credentials for every agent asked.
    pub(crate) client: Client,
}

/// What one fetch brought: the findings to consider, whether more matched, and the
/// agents of a cluster that did not answer.
struct Fetch {
    batch: Vec<Fetched>,
    more: Option<Option<usize>>,
    unreachable: Vec<(Member, String)>,
}

/// How many findings `--follow` starts with unless `--last` says.
pub(crate) const DEFAULT_FOLLOW_LAST: usize = 10;

/// One run of `node-diag findings`: the server answering, and what was seen.
pub(crate) struct Session {
    opts: Options,
    /// The server that answered; chosen at the first poll.
    url: Option<String>,
    tracker: Tracker,
    polls: u64,
    warned_truncated: bool,
    /// `--cluster`: the agents that did not answer the last poll, with why.
    down: BTreeMap<SocketAddr, String>,
    /// `--cluster`: each agent's node, as its findings name it.
    nodes: HashMap<SocketAddr, String>,
}

impl Session {
    pub(crate) fn new(opts: Options) -> Session {
        Session {
            url: opts.server.clone(),
            opts,
            tracker: Tracker::default(),
            polls: 0,
            warned_truncated: false,
            down: BTreeMap::new(),
            nodes: HashMap::new(),
        }
    }

    /// Whether the last poll of `--cluster` missed an agent.
    pub(crate) fn some_unreachable(&self) -> bool {
        !self.down.is_empty()
    }

    /// `--cluster`: asks every agent, merges their answers and joins the two ends of
    /// failed connects. An agent that sends no `node` is named by its address.
    fn fetch_cluster(&mut self, cluster: &Cluster, limit: usize) -> Result<Fetch, ClientError> {
        let members = cluster.members()?;
        let path = format!("/findings?{}", self.opts.filters.query(limit));
        let client = self.opts.client.clone();
        let get = |url: &str, path: &str| get(&client, url, path);
        let answers = cluster::fetch_all(&members, &path, &get);
        let mut all = Vec::new();
        let mut unreachable = Vec::new();
        let mut answered = Vec::new();
        let (mut matched, mut truncated) = (0usize, false);
        for (m, answer) in members.iter().zip(answers) {
            let parsed = answer.and_then(|a| {
                parse_findings(&a.body)
                    .map(|fs| (a.total, a.truncated, fs))
                    .map_err(|cause| ClientError::Parse {
                        url: m.addr.to_string(),
                        cause,
                    })
            });
            match parsed {
                Ok((total, cut, mut fs)) => {
                    for f in &mut fs {
                        match &f.node {
                            Some(n) => {
                                self.nodes.insert(m.addr, n.clone());
                            }
                            None => f.node = Some(m.addr.ip().to_string()),
                        }
                    }
                    matched += total.unwrap_or(0).max(fs.len());
                    truncated |= cut || total.is_some_and(|t| t > fs.len());
                    all.extend(fs);
                    answered.push(m.clone());
                }
                Err(e) => unreachable.push((m.clone(), describe(&e))),
            }
        }
        if answered.is_empty() {
            return Err(ClientError::NoneAnswered {
                name: cluster.name.clone(),
                agents: unreachable
                    .iter()
                    .map(|(m, why)| format!("{}: {why}", m.addr))
                    .collect(),
            });
        }
        // A filter may have kept a timeout's other end away (another kind, the server
        // pod's namespace): fetch the inbound drops apart, unfiltered.
        let narrowed = self.opts.filters.narrows();
        let partners = if narrowed && join::has_candidates(&all) {
            let path = format!(
                "/findings?kind={}&limit={MAX_LIMIT}",
                crate::findings::Kind::TcpSynDropped
            );
            cluster::fetch_all(&answered, &path, &get)
                .into_iter()
                .zip(&answered)
                .filter_map(|(a, m)| {
                    let mut fs = parse_findings(&a.ok()?.body).ok()?;
                    for f in &mut fs {
                        f.node.get_or_insert_with(|| m.addr.ip().to_string());
                    }
                    Some(fs)
                })
                .flatten()
                .collect()
        } else {
            Vec::new()
        };
        let mut all = join::join(all, &partners);
        let now = SystemTime::now();
        all.retain(|f| self.opts.filters.matches(&f.finding, now));
        all.sort_by(|a, b| a.finding.last_seen.cmp(&b.finding.last_seen));
        // The answers' own cut, or this one: joins make two findings one, so the
        // agents' totals are an upper bound here.
        let more = if all.len() > limit {
            all.drain(..all.len() - limit);
            Some(Some(matched))
        } else if truncated {
            Some(Some(matched))
        } else {
            None
        };
        Ok(Fetch {
            batch: all,
            more,
            unreachable,
        })
    }

    /// Says on `err` (and in JSON on `out`) which agents stopped or started answering
    /// since the last poll.
    fn report_agents(
        &mut self,
        unreachable: Vec<(Member, String)>,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<(), ClientError> {
        let now: BTreeMap<SocketAddr, String> = unreachable
            .into_iter()
            .map(|(m, why)| (m.addr, why))
            .collect();
        let name = |addr: &SocketAddr, nodes: &HashMap<SocketAddr, String>| match nodes.get(addr) {
            Some(node) => format!("{addr} (node {node})"),
            None => addr.to_string(),
        };
        for (addr, why) in &now {
            if self.down.contains_key(addr) {
                continue;
            }
            let _ = writeln!(
                err,
                "node-diag: agent {} did not answer: {why}",
                name(addr, &self.nodes)
            );
            if self.opts.format == FindingsFormat::Json {
                let line = serde_json::json!({
                    "agent_unreachable": {
                        "agent": addr.to_string(),
                        "node": self.nodes.get(addr),
                        "error": why,
                    }
                });
                writeln!(out, "{line}").map_err(ClientError::Write)?;
            }
        }
        for addr in self.down.keys() {
            if !now.contains_key(addr) {
                let _ = writeln!(
                    err,
                    "node-diag: agent {} answers again",
                    name(addr, &self.nodes)
                );
            }
        }
        self.down = now;
        Ok(())
    }

    /// Fetches the matching findings, oldest first, at most `limit` of them, and whether
    /// more matched: `Some(how many matched)`, `Some(None)` when the agent did not say.
    fn fetch(&mut self, limit: usize) -> Result<Fetch, ClientError> {
        if let Some(cluster) = self.opts.cluster.clone() {
            return self.fetch_cluster(&cluster, limit);
        }
        let path = format!("/findings?{}", self.opts.filters.query(limit));
        let client = &self.opts.client;
        let answer = match &self.url {
            Some(url) => get(client, url, &path)?,
            None => match get(client, DEFAULT_SERVER, &path) {
                Ok(a) => {
                    self.url = Some(DEFAULT_SERVER.to_string());
                    a
                }
                // Agents from before the findings listener served it beside the
                // metrics, never under TLS.
                Err(first @ ClientError::Connect { .. }) if client.scheme() == "http" => {
                    match get(client, LEGACY_SERVER, &path) {
                        Ok(a) => {
                            self.url = Some(LEGACY_SERVER.to_string());
                            a
                        }
                        Err(_) => return Err(first),
                    }
                }
                Err(e) => return Err(e),
            },
        };
        let url = self.url.clone().unwrap_or_default();
        let mut all =
            parse_findings(&answer.body).map_err(|cause| ClientError::Parse { url, cause })?;
        // Again here: an agent from before the parameters sends its whole store.
        let now = SystemTime::now();
        all.retain(|f| self.opts.filters.matches(&f.finding, now));
        // Oldest first by last_seen, as the contract says (older agents send the store's
        // first-seen order); the sort is stable, so equal times keep the agent's order.
        all.sort_by(|a, b| a.finding.last_seen.cmp(&b.finding.last_seen));
        let received = all.len();
        if all.len() > limit {
            all.drain(..all.len() - limit);
        }
        let matched = answer.total.unwrap_or(0).max(received);
        let more = if matched > all.len() {
            Some(Some(matched))
        } else if answer.truncated {
            Some(None)
        } else {
            None
        };
        Ok(Fetch {
            batch: all,
            more,
            unreachable: Vec::new(),
        })
    }

    /// One poll: prints what it should to `out`, and notes on `err`.
    pub(crate) fn poll(
        &mut self,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<(), ClientError> {
        let first = self.polls == 0;
        self.polls += 1;
        let last = match (self.opts.follow, self.opts.last) {
            (_, Some(n)) => n,
            (false, None) => MAX_LIMIT,
            (true, None) => DEFAULT_FOLLOW_LAST,
        };
        // Following, every poll asks for as much as it may, so that an older finding
        // that ends (its last_seen unchanged) is still in the answer.
        let limit = if self.opts.follow { MAX_LIMIT } else { last };
        let Fetch {
            batch,
            more,
            unreachable,
        } = self.fetch(limit)?;
        let cluster = self.opts.cluster.is_some();
        if cluster {
            self.report_agents(unreachable, out, err)?;
        }
        let changes = self.tracker.update(&batch);
        let shown: Vec<(usize, Change)> = if first {
            // The start: only the last N.
            let skip = batch.len().saturating_sub(last);
            changes.into_iter().filter(|(i, _)| *i >= skip).collect()
        } else {
            changes
        };
        for (i, _change) in shown {
            let f = &batch[i];
            let text = match self.opts.format {
                FindingsFormat::Json => serde_json::to_string(&f.raw).unwrap_or_default(),
                FindingsFormat::Text => output::compact_line_on(
                    &f.finding,
                    f.node.as_deref().filter(|_| cluster),
                    self.opts.color,
                ),
                FindingsFormat::Wide => {
                    output::wide_lines_on(&f.finding, f.node.as_deref(), cluster, self.opts.color)
                }
            };
            writeln!(out, "{text}").map_err(ClientError::Write)?;
        }
        out.flush().map_err(ClientError::Write)?;
        // `--last N` without `--follow` asked for the cut.
        let asked = !self.opts.follow && self.opts.last.is_some();
        if let Some(matched) = more.filter(|_| !asked && !self.warned_truncated) {
            self.warned_truncated = true;
            let of = matched.map(|m| format!(" of {m}")).unwrap_or_default();
            let _ = writeln!(
                err,
                "node-diag: showing the {} most recent{of} matching findings; narrow them with --kind, --severity, --namespace, --pod, --since or --status",
                batch.len()
            );
        }
        Ok(())
    }
}

/// Prints the agent's findings; with `follow`, keeps polling and prints each finding
/// again whenever it grows or its status changes, until interrupted. `Ok(true)`: with
/// `--cluster`, some agents did not answer the last poll.
pub(crate) fn run(opts: Options) -> Result<bool, ClientError> {
    let poll = opts.poll;
    run_with(opts, &mut io::stdout(), &mut io::stderr(), |_| {
        std::thread::sleep(poll);
        true
    })
}

/// [`run`] writing to `out` and `err`; between two polls of `--follow`, `between(polls
/// made)` waits and says whether to go on.
///
/// Once the agent has answered, `--follow` outlives its restarts: a failed poll is said
/// once on `err`, and polling goes on until it answers again (its findings after a
/// restart are new entries, printed as such).
fn run_with(
    opts: Options,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut between: impl FnMut(u64) -> bool,
) -> Result<bool, ClientError> {
    let follow = opts.follow;
    let mut session = Session::new(opts);
    let mut answered = false;
    let mut failing = false;
    loop {
        match session.poll(out, err) {
            Ok(()) => {
                if failing {
                    let _ = writeln!(err, "node-diag: the agent answers again");
                }
                (answered, failing) = (true, false);
            }
            // A reader that went away (`| head`) ends the run quietly.
            Err(ClientError::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
                return Ok(session.some_unreachable());
            }
            Err(e) if follow && answered => {
                if !failing {
                    let _ = writeln!(err, "node-diag: {}; polling on", describe(&e));
                    failing = true;
                }
            }
            Err(e) => return Err(e),
        }
        if !follow || !between(session.polls) {
            return Ok(session.some_unreachable());
        }
    }
}

#[cfg(test)]
mod tests;
