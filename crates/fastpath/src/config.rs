//! The config file: a TOML table whose keys are `fastpath run`'s long
//! option names, turned into arguments and parsed by the very same clap
//! definition, so the file can never drift from the command line and every
//! option added to `RunArgs` works in the file with no code here.
//!
//! ```toml
//! interface = ["eth0", "eth1"]   # repeated option: an array (or one string)
//! flow-timeout = 30              # numbers and strings: the option's value
//! allow-netfilter-bypass = true  # flags: booleans
//! ```
//!
//! Options given on the command line override the file, key by key (for
//! `interface`, the command line's list replaces the file's, and a reload
//! then leaves the interface set alone).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::{ArgAction, Args, ColorChoice, Command, FromArgMatches};

use crate::RunArgs;

/// Where the service and `check-config` look unless told otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/fastpath/fastpath.toml";

/// Keys that name an option but make no sense in the file.
const NOT_IN_FILE: &[&str] = &["config", "help"];

#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The file to check.
    #[arg(value_name = "FILE", default_value = DEFAULT_CONFIG)]
    pub file: PathBuf,
}

/// Every option's effective value as clap saw it (defaults included), by
/// long name: what a reload compares, whatever the option's type.
pub type Raw = BTreeMap<String, Vec<String>>;

/// A resolved `fastpath run` configuration.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub args: RunArgs,
    pub raw: Raw,
}

fn run_command() -> Command {
    RunArgs::augment_args(Command::new("fastpath run")).no_binary_name(true).color(ColorChoice::Never)
}

/// The options given after `run` on this process's command line.
pub fn cli_run_args() -> Vec<OsString> {
    std::env::args_os().skip_while(|a| a != "run").skip(1).collect()
}

/// clap's error without its "error: " prefix and usage tips: one line,
/// with the choices an enum option has when clap lists them.
fn clap_line(e: &clap::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match s.lines().map(str::trim).find(|l| l.starts_with("[possible values:")) {
        Some(choices) => format!("{first} {choices}"),
        None => first.to_string(),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// One TOML value as the text of an option value.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// One key's arguments: `--key=value` per value, `--key` for a true flag.
fn key_args(arg: &clap::Arg, key: &str, v: &toml::Value) -> std::result::Result<Vec<String>, String> {
    let opt = |s: String| format!("--{key}={s}");
    match arg.get_action() {
        ArgAction::SetTrue => match v {
            toml::Value::Boolean(true) => Ok(vec![format!("--{key}")]),
            toml::Value::Boolean(false) => Ok(vec![]),
            other => Err(format!("expected true or false, got {}", type_name(other))),
        },
        ArgAction::Append => {
            let items: Vec<&toml::Value> = match v {
                toml::Value::Array(a) => a.iter().collect(),
                one => vec![one],
            };
            items
                .into_iter()
                .map(|i| scalar(i).map(opt).ok_or_else(|| format!("expected strings or numbers, got {}", type_name(i))))
                .collect()
        }
        ArgAction::Set => scalar(v).map(|s| vec![opt(s)]).ok_or_else(|| match v {
            toml::Value::Array(_) => "takes one value, not an array".to_string(),
            other => format!("expected a string or a number, got {}", type_name(other)),
        }),
        other => Err(format!("option kind {other:?} is not supported in the file")),
    }
}

/// The file's arguments, each with the id of the option it sets. `name`
/// only labels errors: "NAME:LINE: key `K`: what is wrong".
pub fn file_args(text: &str, name: &str) -> Result<Vec<(String, Vec<String>)>> {
    let spans = toml::de::DeTable::parse(text).map_err(|e| {
        let line = e.span().map(|s| format!(":{}", line_of(text, s.start))).unwrap_or_default();
        anyhow::anyhow!("{name}{line}: {}", e.message().trim().replace('\n', " "))
    })?;
    let table: toml::Table = text.parse().with_context(|| format!("{name}: not a TOML table"))?;
    let cmd = run_command();
    let mut out = Vec::new();
    for (key, span) in spans.get_ref().iter().map(|(k, _)| (k.get_ref().to_string(), k.span())) {
        let at = format!("{name}:{}: key `{key}`", line_of(text, span.start));
        let Some(value) = table.get(&key) else { continue };
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .filter(|_| !NOT_IN_FILE.contains(&key.as_str()));
        let Some(arg) = arg else {
            bail!("{at}: unknown option (the keys are `fastpath run --help`'s long option names)");
        };
        let args = key_args(arg, &key, value).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        // Parsed alone, so a bad value is blamed on its own key.
        if let Err(e) = run_command().try_get_matches_from(&args) {
            bail!("{at}: {}", clap_line(&e));
        }
        out.push((arg.get_id().to_string(), args));
    }
    Ok(out)
}

/// The file's options overlaid with the command line's: an option the
/// command line gives replaces the file's entirely.
pub fn merge(file: &[(String, Vec<String>)], cli: &[OsString]) -> Result<Loaded> {
    let cmd = run_command();
    let cli_m = cmd.clone().try_get_matches_from(cli).map_err(|e| anyhow::anyhow!("{}", clap_line(&e)))?;
    let mut argv: Vec<OsString> = Vec::new();
    for (id, args) in file {
        if cli_m.value_source(id) != Some(ValueSource::CommandLine) {
            argv.extend(args.iter().map(OsString::from));
        }
    }
    argv.extend(cli.iter().cloned());
    let m = cmd.clone().try_get_matches_from(&argv).map_err(|e| anyhow::anyhow!("{}", clap_line(&e)))?;
    let args = RunArgs::from_arg_matches(&m).map_err(|e| anyhow::anyhow!("{}", clap_line(&e)))?;
    let mut raw = Raw::new();
    for a in cmd.get_arguments() {
        let (Some(long), id) = (a.get_long(), a.get_id().as_str()) else { continue };
        let vals = m
            .get_raw(id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        raw.insert(long.to_string(), vals);
    }
    Ok(Loaded { args, raw })
}

/// Reads `path` and overlays `cli` on it.
pub fn load(path: &Path, cli: &[OsString]) -> Result<Loaded> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    let file = file_args(&text, &path.display().to_string())?;
    merge(&file, cli)
}

/// `fastpath run`: the file named by --config (if any) under the command line.
pub fn for_run(args: RunArgs) -> Result<Loaded> {
    let cli = cli_run_args();
    match &args.config {
        Some(path) => load(path, &cli),
        None => merge(&[], &cli),
    }
}

/// What can be checked without starting beyond what parsing checks (types,
/// values, the metrics address): the interfaces. `xdp_ours`: a running
/// daemon holds them.
pub fn validate(args: &RunArgs, xdp_ours: bool) -> Result<()> {
    combinable(args)?;
    crate::preflight::check_interfaces(&args.interfaces, &|ifindex, prog| {
        xdp_ours || crate::pin::owns_xdp(args, ifindex, prog)
    })?;
    Ok(())
}

/// Options that parse one by one but do not go together.
pub fn combinable(args: &RunArgs) -> Result<()> {
    let stateful = args.mode == crate::FwdMode::Stateful;
    if args.datapath == crate::Datapath::Afxdp && (stateful || args.pin) {
        anyhow::bail!("--datapath afxdp works in stateless mode without --pin only");
    }
    if args.flow_key == crate::FlowKey::Addresses && stateful {
        anyhow::bail!(
            "--flow-key addresses works in stateless mode only: a conntrack verdict belongs to one connection, its 5-tuple"
        );
    }
    Ok(())
}

/// `fastpath check-config [FILE]`: prints "ok" or fails with one line.
pub fn check(c: &CheckArgs) -> Result<()> {
    let loaded = load(&c.file, &[])?;
    // A running daemon already holds the interfaces: checking the file it
    // is about to reload must not trip over its own programs.
    let live = crate::preflight::socket_state(&loaded.args.socket).is_err();
    validate(&loaded.args, live).with_context(|| c.file.display().to_string())?;
    println!("ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn load_str(text: &str, cli: &[&str]) -> Result<Loaded> {
        merge(&file_args(text, "t.toml")?, &os(cli))
    }

    fn err(text: &str) -> String {
        format!("{:#}", load_str(text, &[]).expect_err("must be refused"))
    }

    #[test]
    fn keys_are_long_options() {
        let l = load_str(
            "interface = [\"eth0\", \"eth1\"]\nflow-timeout = 7\nallow-netfilter-bypass = true\nxdp-mode = \"generic\"\nsocket = \"/tmp/x.sock\"\nct-mark = 0x10\n",
            &[],
        )
        .expect("valid");
        assert_eq!(l.args.interfaces, vec!["eth0", "eth1"]);
        assert_eq!(l.args.flow_timeout, 7);
        assert!(l.args.allow_netfilter_bypass);
        assert_eq!(l.args.xdp_mode, crate::XdpMode::Generic);
        assert_eq!(l.args.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(l.args.ct_mark, 16);
        assert_eq!(l.raw["flow-timeout"], vec!["7"]);
        assert_eq!(l.raw["interface"], vec!["eth0", "eth1"]);
    }

    #[test]
    fn one_interface_may_be_a_string_and_false_flags_are_absent() {
        let l = load_str("interface = \"eth0\"\nallow-netfilter-bypass = false\n", &[]).expect("valid");
        assert_eq!(l.args.interfaces, vec!["eth0"]);
        assert!(!l.args.allow_netfilter_bypass);
    }

    #[test]
    fn defaults_without_a_file() {
        let l = merge(&[], &[]).expect("valid");
        assert_eq!(l.args.flow_timeout, fastpath_bpf::intf::FP_DEFAULT_FLOW_TIMEOUT);
        assert!(l.args.interfaces.is_empty());
    }

    #[test]
    fn command_line_overrides_the_file() {
        let text = "interface = [\"eth0\", \"eth1\"]\nflow-timeout = 7\nfib4-entries = 100\n";
        let l = load_str(text, &["-i", "eth9", "--flow-timeout", "9"]).expect("valid");
        assert_eq!(l.args.interfaces, vec!["eth9"]);
        assert_eq!(l.args.flow_timeout, 9);
        assert_eq!(l.args.fib4_entries, 100);
    }

    /// `auto` takes the /24 index from a full-table capacity on; the
    /// explicit choices win either way; a bad value is named with its key.
    #[test]
    fn fib4_index_follows_the_capacity_unless_chosen() {
        let big = crate::FIB4_DIR24_AUTO.to_string();
        let small = (crate::FIB4_DIR24_AUTO - 1).to_string();
        assert!(!merge(&[], &[]).expect("valid").args.fib4_dir());
        assert!(load_str("", &["--fib4-entries", &big]).expect("valid").args.fib4_dir());
        assert!(!load_str("", &["--fib4-entries", &small]).expect("valid").args.fib4_dir());
        assert!(!load_str("fib4-index = \"trie\"\n", &["--fib4-entries", &big]).expect("valid").args.fib4_dir());
        assert!(load_str("fib4-index = \"dir24\"\n", &[]).expect("valid").args.fib4_dir());
        let e = err("fib4-index = \"hash\"\n");
        assert!(e.starts_with("t.toml:1: key `fib4-index`: invalid value 'hash'"), "{e}");
        assert!(e.ends_with("[possible values: auto, trie, dir24]") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let e = err("flow-timeout = 3\n\nno-such-option = 1\n");
        assert!(e.starts_with("t.toml:3: key `no-such-option`: unknown option"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(err("config = \"/x\"\n").contains("key `config`: unknown option"));
        // Field names are not keys; the option names are.
        assert!(err("flow_timeout = 3\n").contains("unknown option"));
    }

    #[test]
    fn wrong_types_are_refused() {
        let e = err("flow-timeout = true\n");
        assert!(e.starts_with("t.toml:1: key `flow-timeout`: expected a string or a number, got a boolean"), "{e}");
        let e = err("\nallow-netfilter-bypass = \"yes\"\n");
        assert!(e.starts_with("t.toml:2: key `allow-netfilter-bypass`: expected true or false"), "{e}");
        assert!(err("flow-timeout = [1, 2]\n").contains("not an array"));
        assert!(err("interface = [[\"a\"]]\n").contains("expected strings or numbers"));
        assert!(err("[metrics]\naddr = 1\n").contains("key `metrics`"));
    }

    #[test]
    fn bad_values_are_blamed_on_their_key() {
        let e = err("flow-timeout = -1\n");
        assert!(e.starts_with("t.toml:1: key `flow-timeout`: invalid value '-1'"), "{e}");
        let e = err("xdp-mode = \"turbo\"\n");
        assert!(e.starts_with("t.toml:1: key `xdp-mode`: invalid value 'turbo'"), "{e}");
        let e = err("ct-mark = 0\n");
        assert!(e.contains("key `ct-mark`"), "{e}");
        let e = err("metrics = \"nowhere\"\n");
        assert!(e.contains("key `metrics`"), "{e}");
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../../deploy/examples/two-port-router.toml");
        let l = load_str(text, &[]).expect("the example is valid");
        assert_eq!(l.args.interfaces, vec!["eth0", "eth1"]);
        assert_eq!(l.args.xdp_mode, crate::XdpMode::Native);
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = err("flow-timeout = 3\ninterface = [\"a\"\n");
        assert!(e.starts_with("t.toml:"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = err("a = 1\na = 2\n");
        assert!(e.starts_with("t.toml:2:"), "{e}");
    }
}
