//! The command line's reference, made from its clap definition so that it cannot drift:
//! shell completions (`node-diag completion SHELL`), man pages (`node-diag man DIR`) and
//! the generated part of docs/cli.md (a test's: it fails when the page is stale, and
//! rewrites it with `NODE_DIAG_BLESS=1`).

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

/// Help is wrapped at this width in every generated text, whatever the terminal.
const WIDTH: usize = 100;

/// Writes `shell`'s completion script for `cmd` to `out`.
pub(crate) fn completion(
    cmd: &mut clap::Command,
    shell: clap_complete::Shell,
    out: &mut dyn Write,
) {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, cmd, name, out);
}

/// Writes a man page for `cmd` (`node-diag.1`) and one per visible subcommand
/// (`node-diag-run.1`, ...) into `dir`; returns their paths.
pub(crate) fn man_pages(cmd: &clap::Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let cmd = cmd.clone().term_width(WIDTH);
    let mut written = Vec::new();
    let mut write = |name: String, page: &clap::Command| -> io::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page.clone())
            .title(name.to_uppercase())
            .render(&mut out)?;
        fs::write(&path, out)?;
        written.push(path);
        Ok(())
    };
    let root = cmd.get_name().to_owned();
    write(root.clone(), &cmd)?;
    for sub in visible(&cmd) {
        write(format!("{root}-{}", sub.get_name()), sub)?;
    }
    Ok(written)
}

/// The generated reference of docs/cli.md: each command's full `--help`, in order.
#[cfg(test)]
fn markdown(cmd: &clap::Command) -> String {
    let mut cmd = cmd.clone().term_width(WIDTH);
    cmd.build();
    let root = cmd.get_name().to_owned();
    let mut out = String::new();
    let mut section = |title: String, cmd: &mut clap::Command| {
        out.push_str(&format!(
            "### `{title}`\n\n```text\n{}\n```\n\n",
            cmd.render_long_help().to_string().trim_end()
        ));
    };
    section(root.clone(), &mut cmd);
    let subs: Vec<clap::Command> = visible(&cmd).cloned().collect();
    for sub in subs {
        let title = format!("{root} {}", sub.get_name());
        let mut sub = sub.bin_name(title.clone()).term_width(WIDTH);
        section(title, &mut sub);
    }
    out.trim_end().to_owned() + "\n"
}

/// Markers around the generated part of docs/cli.md.
#[cfg(test)]
const BEGIN: &str = "<!-- cli-reference:begin (generated: NODE_DIAG_BLESS=1 cargo test -p node-diag cli_reference) -->";
#[cfg(test)]
const END: &str = "<!-- cli-reference:end -->";

/// `doc` with the text between [`BEGIN`] and [`END`] replaced by `generated`; `None`
/// when the markers are missing.
#[cfg(test)]
fn splice(doc: &str, generated: &str) -> Option<String> {
    let start = doc.find(BEGIN)? + BEGIN.len();
    let end = start + doc[start..].find(END)?;
    Some(format!("{}\n\n{generated}\n{}", &doc[..start], &doc[end..]))
}

fn visible(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;
    use crate::Cli;

    fn doc_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md")
    }

    /// docs/cli.md's reference is what the command line says now; `NODE_DIAG_BLESS=1`
    /// rewrites it.
    #[test]
    fn cli_reference_in_the_docs_is_current() {
        let doc = fs::read_to_string(doc_path()).unwrap();
        let generated = markdown(&Cli::command());
        let want = splice(&doc, &generated).expect("docs/cli.md has the reference markers");
        if std::env::var_os("NODE_DIAG_BLESS").is_some() {
            fs::write(doc_path(), &want).unwrap();
            return;
        }
        assert!(
            doc == want,
            "docs/cli.md's generated reference is stale: run NODE_DIAG_BLESS=1 cargo test -p node-diag cli_reference"
        );
    }

    #[test]
    fn the_reference_has_every_command_and_flag() {
        let md = markdown(&Cli::command());
        for needle in [
            "### `node-diag run`",
            "### `node-diag findings`",
            "### `node-diag completion`",
            "--findings-listen",
            "--icmp-watch",
            "--cluster",
        ] {
            assert!(md.contains(needle), "no {needle} in\n{md}");
        }
        assert!(!md.contains("### `node-diag man`"), "man is hidden");
        assert!(!md.contains('\u{1b}'), "no terminal escapes");
    }

    #[test]
    fn completions_and_man_pages_cover_the_subcommands() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            completion(&mut Cli::command(), shell, &mut out);
            let script = String::from_utf8(out).unwrap();
            for sub in ["run", "findings", "doctor", "probe", "mtu", "services"] {
                assert!(script.contains(sub), "{shell}: no {sub}");
            }
            assert!(script.contains("findings-listen"), "{shell}");
        }
        let dir = std::env::temp_dir().join(format!("nd-man-{}", std::process::id()));
        let pages = man_pages(&Cli::command(), &dir).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&"node-diag.1".to_owned()), "{names:?}");
        assert!(names.contains(&"node-diag-run.1".to_owned()), "{names:?}");
        let run = fs::read_to_string(dir.join("node-diag-run.1")).unwrap();
        assert!(run.starts_with(".ie") || run.contains(".TH"), "{run}");
        assert!(run.contains("findings\\-listen"), "{run}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let doc = format!("head\n{BEGIN}\nold\n{END}\ntail\n");
        assert_eq!(
            splice(&doc, "new\n").unwrap(),
            format!("head\n{BEGIN}\n\nnew\n\n{END}\ntail\n")
        );
        assert_eq!(splice("no markers", "x"), None);
    }
}
