//! What `node-diag probe` says on stderr while it searches, since a black-holed path
//! takes seconds of silence per vanished size: on a terminal one line rewritten in
//! place (`probing 10.0.0.2: 68 ok, 1500 lost, 1500 lost…`) and cleared at the end;
//! with `-v` one line per probe, kept. Never on stdout, which carries the report.

use std::{io::Write, net::IpAddr};

use super::packets::Outcome;

/// How many of the latest outcomes the terminal line shows.
const RECENT: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Off,
    /// One line rewritten in place (stderr is a terminal).
    Terminal,
    /// One line per step (`-v`).
    Lines,
}

impl Mode {
    pub(crate) fn new(verbose: bool, stderr_is_terminal: bool) -> Mode {
        match (verbose, stderr_is_terminal) {
            (true, _) => Mode::Lines,
            (false, true) => Mode::Terminal,
            (false, false) => Mode::Off,
        }
    }
}

/// Progress of one probe, written to `out` (stderr).
pub(crate) struct Progress<W: Write> {
    mode: Mode,
    out: W,
    dst: IpAddr,
    recent: Vec<String>,
    sent: u32,
    drawn: bool,
}

/// One probe's fate in a word or two.
pub(crate) fn word(o: &Outcome) -> String {
    match o {
        Outcome::Reply => "ok".into(),
        Outcome::FragNeeded {
            next_hop_mtu: Some(m),
            ..
        } => format!("frag-needed (MTU {m})"),
        Outcome::FragNeeded { .. } => "frag-needed".into(),
        Outcome::Unreachable { code, .. } => format!("unreachable (code {code})"),
        Outcome::LocalTooBig => "too big for the interface".into(),
        Outcome::Lost => "lost".into(),
    }
}

impl<W: Write> Progress<W> {
    pub(crate) fn new(mode: Mode, out: W, dst: IpAddr) -> Self {
        Progress {
            mode,
            out,
            dst,
            recent: Vec::new(),
            sent: 0,
            drawn: false,
        }
    }

    /// A probe of `size` bytes came back as `outcome`. Write errors are ignored: a
    /// closed stderr must not fail the probe.
    pub(crate) fn probed(&mut self, size: u32, outcome: &Outcome) {
        self.sent += 1;
        let step = format!("{size} {}", word(outcome));
        match self.mode {
            Mode::Off => {}
            Mode::Lines => {
                let _ = writeln!(self.out, "probing {}: {step}", self.dst);
            }
            Mode::Terminal => {
                self.recent.push(step);
                let from = self.recent.len().saturating_sub(RECENT);
                let _ = write!(
                    self.out,
                    "\r\x1b[Kprobing {}: {}… ({} sent)",
                    self.dst,
                    self.recent[from..].join(", "),
                    self.sent
                );
                let _ = self.out.flush();
                self.drawn = true;
            }
        }
    }

    /// The TCP check is starting.
    pub(crate) fn connecting(&mut self, port: u16) {
        let to = std::net::SocketAddr::new(self.dst, port);
        match self.mode {
            Mode::Off => {}
            Mode::Lines => {
                let _ = writeln!(self.out, "connecting to {to}");
            }
            Mode::Terminal => {
                let _ = write!(self.out, "\r\x1b[Kconnecting to {to}…");
                let _ = self.out.flush();
                self.drawn = true;
            }
        }
    }

    /// The search is over: the terminal line goes, so the report stands alone.
    pub(crate) fn finish(&mut self) {
        if self.drawn {
            let _ = write!(self.out, "\r\x1b[K");
            let _ = self.out.flush();
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn run(mode: Mode) -> String {
        let mut out = Vec::new();
        let mut p = Progress::new(mode, &mut out, DST);
        p.probed(68, &Outcome::Reply);
        p.probed(1500, &Outcome::Lost);
        p.probed(1500, &Outcome::Lost);
        p.probed(
            1450,
            &Outcome::FragNeeded {
                next_hop_mtu: Some(1400),
                from: DST,
            },
        );
        p.probed(1400, &Outcome::Reply);
        p.connecting(80);
        p.finish();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn verbose_prints_a_line_per_step() {
        assert_eq!(
            run(Mode::Lines),
            "probing 10.0.0.2: 68 ok\nprobing 10.0.0.2: 1500 lost\nprobing 10.0.0.2: 1500 lost\n\
             probing 10.0.0.2: 1450 frag-needed (MTU 1400)\nprobing 10.0.0.2: 1400 ok\n\
             connecting to 10.0.0.2:80\n"
        );
    }

    #[test]
    fn a_terminal_gets_one_line_rewritten_then_cleared() {
        let out = run(Mode::Terminal);
        assert!(!out.contains('\n'), "{out:?}");
        assert!(
            out.contains(
                "\r\x1b[Kprobing 10.0.0.2: 1500 lost, 1500 lost, 1450 frag-needed (MTU 1400), 1400 ok… (5 sent)"
            ),
            "{out:?}"
        );
        assert!(
            out.ends_with("connecting to 10.0.0.2:80…\r\x1b[K"),
            "{out:?}"
        );
        assert_eq!(run(Mode::Off), "");
        assert_eq!(Mode::new(false, false), Mode::Off);
        assert_eq!(Mode::new(true, false), Mode::Lines);
        assert_eq!(Mode::new(false, true), Mode::Terminal);
    }
}
