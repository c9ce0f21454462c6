//! SIGHUP: re-read the config file and apply what can change without
//! disturbing traffic. The new file is parsed and validated whole first: a
//! bad one is rejected and the running configuration stays as it is. Then
//! the interface set changes (see `ifset`), all or nothing: an added
//! interface that cannot be attached rejects the reload whole too. Then
//! each other option that differs is either applied live (the `LIVE` table)
//! or reported as needing a restart and left at its running value; nothing
//! is half-applied. Options are compared by clap's effective raw values, so
//! an option someone adds to `RunArgs` is covered (as "needs a restart")
//! without code here.

use std::path::PathBuf;

use log::{error, info, warn};

use crate::config::{self, Loaded, Raw};
use crate::ctwatch::CtMarks;
use crate::RunArgs;

/// What the daemon exposes to a reload. Each setter applies one runtime
/// setting to the data path, or says why that needs a restart.
pub trait Live {
    fn set_flow_timeout(&mut self, secs: u32) -> Result<(), String>;
    /// Stateful mode's fast-path mark bits, both directions' (no effect in stateless mode).
    fn set_ct_mark(&mut self, marks: CtMarks) -> Result<(), String>;
    /// Stateful mode's revalidation interval (no effect in stateless mode).
    fn set_ct_revalidate_ms(&mut self, ms: u32) -> Result<(), String>;
    /// Attaches the interfaces of `names` not running yet and detaches the
    /// running ones it lacks, or changes nothing.
    fn set_interfaces(&mut self, names: &[String]) -> Result<(), Refusal>;
}

/// Why `Live::set_interfaces` left the running set as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The new set cannot run (an interface does not attach, ...): the
    /// reload is rejected whole.
    Invalid(String),
    /// The new set is fine but only a restart can apply it.
    Restart(String),
}

/// The option whose change goes through `Live::set_interfaces`.
const INTERFACES: &str = "interface";

type Apply = fn(&RunArgs, &mut dyn Live) -> Result<(), String>;

/// Options a reload applies live, by long name: adding one is one line here
/// (plus its setter on `Live`).
const LIVE: &[(&str, Apply)] = &[
    ("flow-timeout", |a, l| l.set_flow_timeout(a.flow_timeout)),
    ("ct-mark", |a, l| l.set_ct_mark(a.ct_marks())),
    ("ct-mark-reply", |a, l| l.set_ct_mark(a.ct_marks())),
    ("ct-revalidate-ms", |a, l| l.set_ct_revalidate_ms(a.ct_revalidate_ms)),
];

/// Options that say where the configuration comes from, not what it is.
const IGNORED: &[&str] = &["config", "help"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Started without --config: nothing to re-read.
    NoFile,
    /// The file did not parse or validate; nothing changed.
    Rejected,
    /// Valid: `applied` options changed live, `restart` options differ but
    /// keep their running value.
    Done { applied: usize, restart: usize },
}

pub struct Reloader {
    path: Option<PathBuf>,
    /// What is running, option by option.
    running: Raw,
}

fn show(v: Option<&Vec<String>>) -> String {
    match v {
        None => "(unset)".into(),
        Some(v) if v.is_empty() => "(unset)".into(),
        Some(v) => v.join(","),
    }
}

impl Reloader {
    pub fn new(loaded: &Loaded) -> Reloader {
        Reloader { path: loaded.args.config.clone(), running: loaded.raw.clone() }
    }

    pub fn reload(&mut self, live: &mut dyn Live) -> Outcome {
        let Some(path) = self.path.clone() else {
            warn!("SIGHUP: started without --config, nothing to re-read");
            return Outcome::NoFile;
        };
        info!("SIGHUP: re-reading {}", path.display());
        // The command line still overrides the file, as it did at start.
        let new = config::load(&path, &config::cli_run_args())
            .and_then(|n| config::validate(&n.args, true).map(|()| n));
        match new {
            Ok(new) => self.apply(&new, live),
            Err(e) => {
                error!("reload rejected, running configuration unchanged: {e:#}");
                Outcome::Rejected
            }
        }
    }

    fn apply(&mut self, new: &Loaded, live: &mut dyn Live) -> Outcome {
        let (mut applied, mut restart) = (0, 0);
        // First, so that a refused set leaves every other option alone too.
        if let Some(value) = new.raw.get(INTERFACES).filter(|v| self.running.get(INTERFACES) != Some(*v)) {
            let (was, now) = (show(self.running.get(INTERFACES)), show(Some(value)));
            match live.set_interfaces(&new.args.interfaces) {
                Ok(()) => {
                    info!("reload: {INTERFACES} {was} -> {now}: applied");
                    self.running.insert(INTERFACES.into(), value.clone());
                    applied += 1;
                }
                Err(Refusal::Invalid(why)) => {
                    error!("reload rejected, running configuration unchanged: {INTERFACES} {was} -> {now}: {why}");
                    return Outcome::Rejected;
                }
                Err(Refusal::Restart(why)) => {
                    warn!("reload: {INTERFACES} {was} -> {now}: needs a restart ({why}); keeping {was}");
                    restart += 1;
                }
            }
        }
        for (key, value) in &new.raw {
            let old = self.running.get(key);
            if old == Some(value) || IGNORED.contains(&key.as_str()) || key == INTERFACES {
                continue;
            }
            let (was, now) = (show(old), show(Some(value)));
            match LIVE.iter().find(|(k, _)| k == key) {
                Some((_, set)) => match set(&new.args, live) {
                    Ok(()) => {
                        info!("reload: {key} {was} -> {now}: applied");
                        self.running.insert(key.clone(), value.clone());
                        applied += 1;
                    }
                    Err(why) => {
                        warn!("reload: {key} {was} -> {now}: needs a restart ({why}); keeping {was}");
                        restart += 1;
                    }
                },
                None => {
                    warn!("reload: {key} {was} -> {now}: fixed at start, needs a restart; keeping {was}");
                    restart += 1;
                }
            }
        }
        if applied + restart == 0 {
            info!("reload: no change");
        }
        Outcome::Done { applied, restart }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        flow_timeout: Option<u32>,
        ct_mark: Option<CtMarks>,
        ct_revalidate_ms: Option<u32>,
        refuse: bool,
        interfaces: Option<Vec<String>>,
        iface_refusal: Option<Refusal>,
    }

    impl Live for Fake {
        fn set_flow_timeout(&mut self, secs: u32) -> Result<(), String> {
            if self.refuse {
                return Err("cache not loaded".into());
            }
            self.flow_timeout = Some(secs);
            Ok(())
        }

        fn set_ct_mark(&mut self, marks: CtMarks) -> Result<(), String> {
            self.ct_mark = Some(marks);
            Ok(())
        }

        fn set_ct_revalidate_ms(&mut self, ms: u32) -> Result<(), String> {
            self.ct_revalidate_ms = Some(ms);
            Ok(())
        }

        fn set_interfaces(&mut self, names: &[String]) -> Result<(), Refusal> {
            if let Some(r) = &self.iface_refusal {
                return Err(r.clone());
            }
            self.interfaces = Some(names.to_vec());
            Ok(())
        }
    }

    fn loaded(text: &str) -> Loaded {
        config::merge(&config::file_args(text, "t.toml").expect("valid"), &[]).expect("valid")
    }

    #[test]
    fn live_options_apply_others_wait_for_a_restart() {
        let mut r = Reloader::new(&loaded("flow-timeout = 30\n"));
        let mut f = Fake::default();
        let out = r.apply(&loaded("flow-timeout = 5\nfib4-entries = 99\n"), &mut f);
        assert_eq!(out, Outcome::Done { applied: 1, restart: 1 });
        assert_eq!(f.flow_timeout, Some(5));
        assert_eq!(r.running["flow-timeout"], vec!["5"]);
        // The restart-only option keeps its running value, so it is
        // reported again on the next reload rather than forgotten.
        assert_ne!(r.running["fib4-entries"], vec!["99"]);
    }

    #[test]
    fn a_refused_live_change_keeps_the_running_value() {
        let mut r = Reloader::new(&loaded("flow-timeout = 0\n"));
        let mut f = Fake { refuse: true, ..Default::default() };
        assert_eq!(r.apply(&loaded("flow-timeout = 5\n"), &mut f), Outcome::Done { applied: 0, restart: 1 });
        assert_eq!(r.running["flow-timeout"], vec!["0"]);
    }

    #[test]
    fn ct_settings_apply_live() {
        let mut r = Reloader::new(&loaded("mode = \"stateful\"\nct-mark = 1\n"));
        let mut f = Fake::default();
        let out = r.apply(&loaded("mode = \"stateful\"\nct-mark = 0x10\nct-revalidate-ms = 250\n"), &mut f);
        assert_eq!(out, Outcome::Done { applied: 2, restart: 0 });
        assert_eq!((f.ct_mark, f.ct_revalidate_ms), (Some(CtMarks { orig: 0x10, reply: 0x2 }), Some(250)));
    }

    #[test]
    fn same_file_is_no_change() {
        let mut r = Reloader::new(&loaded("flow-timeout = 30\n"));
        let mut f = Fake::default();
        assert_eq!(r.apply(&loaded("flow-timeout = 30\n"), &mut f), Outcome::Done { applied: 0, restart: 0 });
        assert_eq!(f.flow_timeout, None);
    }

    #[test]
    fn interface_set_changes_live() {
        let mut r = Reloader::new(&loaded("interface = [\"a\", \"b\"]\n"));
        let mut f = Fake::default();
        let out = r.apply(&loaded("interface = [\"a\", \"b\", \"c\"]\nflow-timeout = 5\n"), &mut f);
        assert_eq!(out, Outcome::Done { applied: 2, restart: 0 });
        assert_eq!(f.interfaces, Some(vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(r.running["interface"], vec!["a", "b", "c"]);
        // The same set again is no change: not handed to the daemon.
        f.interfaces = None;
        assert_eq!(r.apply(&loaded("interface = [\"a\", \"b\", \"c\"]\nflow-timeout = 5\n"), &mut f), Outcome::Done { applied: 0, restart: 0 });
        assert_eq!(f.interfaces, None);
    }

    #[test]
    fn a_refused_interface_set_rejects_the_whole_reload() {
        let mut r = Reloader::new(&loaded("interface = [\"a\"]\nflow-timeout = 30\n"));
        let mut f = Fake { iface_refusal: Some(Refusal::Invalid("attaching XDP to bad0: no".into())), ..Default::default() };
        let out = r.apply(&loaded("interface = [\"a\", \"bad0\"]\nflow-timeout = 5\n"), &mut f);
        assert_eq!(out, Outcome::Rejected);
        assert_eq!(f.flow_timeout, None, "no other option applied");
        assert_eq!(r.running["interface"], vec!["a"]);
        assert_eq!(r.running["flow-timeout"], vec!["30"]);
    }

    #[test]
    fn an_interface_set_needing_a_restart_keeps_the_running_one() {
        let mut r = Reloader::new(&loaded("interface = [\"a\"]\n"));
        let mut f = Fake { iface_refusal: Some(Refusal::Restart("afxdp".into())), ..Default::default() };
        let out = r.apply(&loaded("interface = [\"a\", \"b\"]\nflow-timeout = 5\n"), &mut f);
        assert_eq!(out, Outcome::Done { applied: 1, restart: 1 });
        assert_eq!(r.running["interface"], vec!["a"]);
        assert_eq!(f.flow_timeout, Some(5));
    }
}
