//! The workloads the bench measures, and the ports, threads and loss they run with:
//! the measurement drives them, and the report names them in its rows.

use serde::Serialize;

pub(super) const IPERF_PORT: u16 = 5201;
pub(super) const ECHO_PORT: u16 = 7000;
/// Nothing listens there: the storm's target.
pub(super) const CLOSED_PORT: u16 = 7999;
/// UDP port the drop flood sends to; node A's forward hook drops it.
pub(super) const FLOOD_PORT: u16 = 7998;
/// Share of the lossy transfer's packets node A drops (‰).
pub(super) const LOSS_PER_MILLE: u32 = 5;
/// Threads of the connection generator (paced and closed loop), of the echo server, of
/// the storm and of the drop flood's sender.
pub(super) const CONN_THREADS: u32 = 16;
pub(super) const ECHO_THREADS: usize = 8;
pub(super) const STORM_THREADS: u32 = 4;
pub(super) const FLOOD_THREADS: u32 = 4;
/// Clients polling `/findings`, and each one's interval between the starts of two polls.
pub(super) const POLL_CLIENTS: u32 = 8;
pub(super) const POLL_INTERVAL_MS: u64 = 100;
/// Pod B's ports the findings poll fills the store with (one refused connect each, so
/// one finding each): more than the store keeps (4,096), so it is full.
pub(super) const FILL_PORTS: std::ops::Range<u16> = 20_000..24_500;

/// One workload of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub(crate) enum Workload {
    /// iperf3 pod A → pod B through the vxlan overlay.
    IperfOverlay,
    /// iperf3 node B → node A across the underlay veth.
    IperfVeth,
    /// iperf3 pod A → pod B through the overlay, a random share of the data dropped in
    /// node A's forward hook: pod A's socket retransmits, so `nd_retransmit` runs hot.
    IperfLossy,
    /// Paced short connections pod A → pod B.
    ConnRate,
    /// Short connections pod A → pod B, each thread's next as soon as the previous ends.
    ConnClosedLoop,
    /// UDP datagrams pod A → pod B, dropped in node A's forward hook.
    DropFlood,
    /// Refused connects pod A → a closed port on pod B, as fast as possible.
    Storm,
    /// A store filled to its bound (refused connects to thousands of ports), polled
    /// unfiltered by eight clients every 100 ms each while a trickle of refused connects
    /// keeps changing it; the agent's CPU is the figure. No polls without the agent.
    FindingsPoll,
    /// 110 pods in node A (a namespace and a veth each, as a CNI plugin wires them), one
    /// replaced every 2 s; the agent's CPU is the figure.
    ScalePods,
    /// 1,000 interfaces (veth pairs in node A) created, then removed, over the window;
    /// the agent's CPU is the figure.
    ScaleInterfaces,
}

impl Workload {
    pub(super) const ALL: [Self; 10] = [
        Self::IperfOverlay,
        Self::IperfVeth,
        Self::IperfLossy,
        Self::ConnRate,
        Self::ConnClosedLoop,
        Self::DropFlood,
        Self::Storm,
        Self::FindingsPoll,
        Self::ScalePods,
        Self::ScaleInterfaces,
    ];

    /// Whether it is a scale workload: the agent's idle cost on a busy node, measured
    /// longer and in fewer pairs (see `Settings::scale_duration`).
    pub fn scale(self) -> bool {
        matches!(self, Self::ScalePods | Self::ScaleInterfaces)
    }

    /// The name `--workload` takes (and the JSON uses).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::IperfOverlay => "iperf3 overlay",
            Self::IperfVeth => "iperf3 veth",
            Self::IperfLossy => "iperf3 overlay, lossy",
            Self::ConnRate => "connection rate",
            Self::ConnClosedLoop => "closed-loop connections",
            Self::DropFlood => "drop flood",
            Self::Storm => "refused storm",
            Self::FindingsPoll => "findings polled by 8 clients",
            Self::ScalePods => "scale: 110 pods, one replaced every 2 s",
            Self::ScaleInterfaces => "scale: 1,000 interfaces created and removed",
        }
    }
}

/// One workload of the scale group: what the agent costs, idle, as the cluster grows
/// around it (`scale`). Not a baseline/agent pair: the agent's own CPU and memory are
/// the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub(crate) enum ScaleWorkload {
    /// kube-proxy-shaped rules of 0, 5,000 and 20,000 Services (iptables-nft and
    /// nftables shapes) in node A, the agent idle there.
    ScaleServices,
}

impl ScaleWorkload {
    /// The `scale` group, in the order it runs: a new scale workload is added here.
    pub(super) const ALL: [Self; 1] = [Self::ScaleServices];

    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

/// `--workload`'s name of the whole scale group.
const SCALE_GROUP: &str = "scale";

/// What `--workload` takes: a pair workload, a scale workload, or the whole `scale`
/// group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    Pair(Workload),
    Scale(ScaleWorkload),
    ScaleGroup,
}

/// Every [`Choice`], for clap: built from the two lists, so a workload added to either
/// is a value of `--workload` without more.
const CHOICES: [Choice; Workload::ALL.len() + ScaleWorkload::ALL.len() + 1] = {
    let mut out = [Choice::ScaleGroup; Workload::ALL.len() + ScaleWorkload::ALL.len() + 1];
    let mut i = 0;
    while i < Workload::ALL.len() {
        out[i] = Choice::Pair(Workload::ALL[i]);
        i += 1;
    }
    let mut j = 0;
    while j < ScaleWorkload::ALL.len() {
        out[i + j] = Choice::Scale(ScaleWorkload::ALL[j]);
        j += 1;
    }
    out
};

impl clap::ValueEnum for Choice {
    fn value_variants<'a>() -> &'a [Self] {
        &CHOICES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            Self::Pair(w) => clap::ValueEnum::to_possible_value(w),
            Self::Scale(w) => clap::ValueEnum::to_possible_value(w),
            Self::ScaleGroup => {
                Some(clap::builder::PossibleValue::new(SCALE_GROUP).help("every scale_* workload"))
            }
        }
    }
}

impl Choice {
    /// The name `--workload` takes.
    pub fn name(self) -> String {
        match self {
            Self::Pair(w) => w.name(),
            Self::Scale(w) => w.name(),
            Self::ScaleGroup => SCALE_GROUP.to_owned(),
        }
    }
}
