//! The interface set on SIGHUP: which interfaces a new config adds and
//! drops, and attaching and detaching them while the others keep
//! forwarding untouched (same program, link, slot and counters).
//!
//! Added interfaces pass the checks of a start, then are loaded, attached
//! and (with --pin) pinned all or none, before anything else changes; only
//! then are the dropped ones unpinned and detached. The tables follow in
//! the daemon's next reconcile (`Loop::manage`): a new interface punts its
//! packets until its fp_ifaces entry is written, and a dropped one stops
//! being an egress at once (its devmap slot goes here), as an interface
//! fastpath never managed.

use std::collections::{BTreeMap, BTreeSet};

use fastpath_bpf::intf;
use fastpath_core::tables::Capacities;
use log::{info, warn};

use crate::loader::{self, Attachment, Instance, LoadOpts};
use crate::maps::Maps;
use crate::pin::Pins;
use crate::preflight::{self, Iface};
use crate::reload::Refusal;
use crate::XdpMode;

/// How a new interface list differs from the running one.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The new set in the file's order, each with its slot.
    pub next: Vec<Iface>,
    pub added: Vec<Iface>,
    pub removed: Vec<Iface>,
}

impl Plan {
    pub fn changes(&self) -> bool {
        !self.added.is_empty() || !self.removed.is_empty()
    }
}

/// `wanted`: the new list as `preflight::check_interfaces` resolved it
/// (its slots are ignored). An interface is kept when its name and ifindex
/// both match: a device deleted and created again under the same name is a
/// new one. Kept interfaces keep their slot; added ones get the lowest
/// slots neither running nor in `taken`.
pub fn plan(running: &[Iface], wanted: &[Iface], taken: &BTreeSet<u32>) -> Result<Plan, String> {
    let same = |a: &Iface, b: &Iface| a.name == b.name && a.ifindex == b.ifindex;
    let used: BTreeSet<u32> = taken.iter().chain(running.iter().map(|i| &i.slot)).copied().collect();
    let mut free = (1..intf::FP_MAX_IFACES).filter(|s| !used.contains(s));
    let (mut next, mut added) = (Vec::new(), Vec::new());
    for w in wanted {
        let slot = match running.iter().find(|r| same(r, w)) {
            Some(r) => r.slot,
            None => {
                let s = free.next().ok_or_else(|| format!("no free interface slot left for {}", w.name))?;
                added.push(Iface { slot: s, ..w.clone() });
                s
            }
        };
        next.push(Iface { slot, ..w.clone() });
    }
    let removed = running.iter().filter(|r| !wanted.iter().any(|w| same(r, w))).cloned().collect();
    Ok(Plan { next, added, removed })
}

/// The daemon's attached interfaces, as a reload may change them.
pub struct Attached<'a> {
    pub ifaces: &'a mut Vec<Iface>,
    pub instances: &'a mut Vec<Instance>,
    pub attachments: &'a mut Vec<Attachment>,
    pub pins: Option<&'a Pins>,
    pub maps: &'a Maps,
    /// Devmap slots the daemon clears when it exits (empty with --pin:
    /// pinned entries outlive it).
    pub tx_slots: &'a mut Vec<u32>,
    pub caps: &'a Capacities,
    pub opts: &'a LoadOpts,
    pub mode: XdpMode,
}

impl Attached<'_> {
    /// Makes `names` the interface set; `taken`: slots the tables may still
    /// use. Returns the plan when the set changed (the caller then updates
    /// the tables), None when it is the same set.
    pub fn change(&mut self, names: &[String], taken: &BTreeSet<u32>) -> Result<Option<Plan>, Refusal> {
        let running: BTreeSet<u32> = self.ifaces.iter().map(|i| i.ifindex).collect();
        // As at start, except that our own programs are not in the way.
        let wanted = preflight::check_interfaces(names, &|ifindex, _| running.contains(&ifindex))
            .map_err(|e| Refusal::Invalid(format!("{e:#}")))?;
        let plan = plan(self.ifaces, &wanted, taken).map_err(Refusal::Invalid)?;
        if !plan.changes() {
            *self.ifaces = plan.next;
            return Ok(None);
        }
        if self.opts.afxdp {
            return Err(Refusal::Restart("the AF_XDP data path sets its ports up at start".into()));
        }
        let (fresh, att) = self.attach(&plan.added)?;
        for r in &plan.removed {
            self.drop_iface(r);
        }
        for ((inst, a), i) in fresh.into_iter().zip(att).zip(&plan.added) {
            info!("{}: attached (ifindex {}, slot {})", a.name, i.ifindex, i.slot);
            if self.pins.is_none() {
                self.tx_slots.push(i.slot);
            }
            self.instances.push(inst);
            self.attachments.push(a);
        }
        *self.ifaces = plan.next.clone();
        Ok(Some(plan))
    }

    /// Loads, attaches, pins and opens the devmap to every interface of
    /// `added`, or to none: on failure what was done is undone.
    fn attach(&self, added: &[Iface]) -> Result<(Vec<Instance>, Vec<Attachment>), Refusal> {
        let refused = |e: anyhow::Error| Refusal::Invalid(format!("{e:#}"));
        let first = self.instances.first().ok_or_else(|| Refusal::Invalid("no running instance to share maps with".into()))?;
        for i in added {
            // The slot may have counted for an interface dropped earlier.
            self.maps.reset_counters(i.slot).map_err(|e| refused(e.into()))?;
        }
        let mut fresh = loader::load_more(added, self.caps, self.opts, first).map_err(refused)?;
        let plain = |k: usize, first: &Instance| loader::load_plain(&added[k], self.caps, self.opts, first);
        // On failure attach_all has detached what it attached.
        let att = loader::attach_all(&mut fresh, self.mode, BTreeMap::new(), &plain).map_err(refused)?;
        let mut failed = None;
        for (k, (a, i)) in att.iter().zip(added).enumerate() {
            let res = match self.pins {
                Some(p) => p.pin_iface(&fresh[k], a),
                None => Ok(()),
            }
            .and_then(|()| Ok(self.maps.add_tx_port(i.slot, i.ifindex)?));
            if let Err(e) = res {
                failed = Some((k, e.context(format!("adding {}", i.name))));
                break;
            }
        }
        if let Some((k, e)) = failed {
            self.undo(&added[..=k], att);
            return Err(refused(e));
        }
        Ok((fresh, att))
    }

    /// Rolls back `attach` for `done` and detaches every link of `att`.
    fn undo(&self, done: &[Iface], att: Vec<Attachment>) {
        for i in done {
            if let Some(p) = self.pins {
                if let Err(e) = p.unpin_iface(i.ifindex) {
                    warn!("{}: {e:#}", i.name);
                }
            }
            let _ = self.maps.del_tx_port(i.slot);
        }
        for a in att {
            let name = a.name.clone();
            if let Err(e) = a.detach() {
                warn!("{name}: detaching XDP: {e}");
            }
        }
    }

    /// Detaches a dropped interface. Its devmap slot goes first: a cached
    /// flow still pointing there is punted (egress not managed) rather than
    /// sent out of an interface fastpath no longer manages.
    fn drop_iface(&mut self, r: &Iface) {
        if let Err(e) = self.maps.del_tx_port(r.slot) {
            log::debug!("devmap slot {} of {}: {e}", r.slot, r.name);
        }
        self.tx_slots.retain(|s| *s != r.slot);
        if let Some(p) = self.pins {
            if let Err(e) = p.unpin_iface(r.ifindex) {
                warn!("{}: {e:#}", r.name);
            }
        }
        if let Some(k) = self.attachments.iter().position(|a| a.ifindex == r.ifindex) {
            // A deleted device took its attachment with it already.
            if let Err(e) = self.attachments.remove(k).detach() {
                log::debug!("{}: detaching XDP: {e}", r.name);
            }
        }
        self.instances.retain(|i| i.ifindex != r.ifindex);
        info!("{}: left the interface set, XDP detached; the kernel forwards its traffic", r.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(name: &str, ifindex: u32, slot: u32) -> Iface {
        Iface { name: name.into(), ifindex, slot }
    }

    fn names(v: &[Iface]) -> Vec<(&str, u32)> {
        v.iter().map(|i| (i.name.as_str(), i.slot)).collect()
    }

    #[test]
    fn added_get_free_slots_kept_keep_theirs() {
        let running = [i("a", 10, 1), i("b", 11, 2)];
        let p = plan(&running, &[i("a", 10, 1), i("b", 11, 2), i("c", 12, 3)], &BTreeSet::from([1, 2])).expect("plan");
        assert_eq!(names(&p.next), [("a", 1), ("b", 2), ("c", 3)]);
        assert_eq!(names(&p.added), [("c", 3)]);
        assert!(p.removed.is_empty());
    }

    #[test]
    fn removed_are_named_and_the_rest_keep_their_slots() {
        let running = [i("a", 10, 1), i("b", 11, 2), i("c", 12, 3)];
        let p = plan(&running, &[i("c", 12, 1), i("a", 10, 2)], &BTreeSet::from([1, 2, 3])).expect("plan");
        assert_eq!(names(&p.next), [("c", 3), ("a", 1)]);
        assert_eq!(names(&p.removed), [("b", 2)]);
        assert!(p.added.is_empty() && p.changes());
    }

    #[test]
    fn reordering_is_no_change() {
        let running = [i("a", 10, 1), i("b", 11, 2)];
        let p = plan(&running, &[i("b", 11, 1), i("a", 10, 2)], &BTreeSet::from([1, 2])).expect("plan");
        assert!(!p.changes());
        assert_eq!(names(&p.next), [("b", 2), ("a", 1)]);
    }

    #[test]
    fn taken_slots_are_skipped() {
        // Slot 2: a dropped interface whose fp_ifaces entry may still be written.
        let running = [i("a", 10, 1)];
        let p = plan(&running, &[i("a", 10, 1), i("x", 20, 2), i("y", 21, 3)], &BTreeSet::from([1, 2])).expect("plan");
        assert_eq!(names(&p.added), [("x", 3), ("y", 4)]);
    }

    #[test]
    fn a_device_recreated_under_its_name_is_a_new_one() {
        let running = [i("a", 10, 1), i("b", 11, 2)];
        let p = plan(&running, &[i("a", 10, 1), i("b", 30, 2)], &BTreeSet::from([1, 2])).expect("plan");
        assert_eq!(names(&p.removed), [("b", 2)]);
        assert_eq!(names(&p.added), [("b", 3)]);
        assert_eq!(p.added[0].ifindex, 30);
    }

    #[test]
    fn no_slot_left_is_refused() {
        let taken: BTreeSet<u32> = (1..intf::FP_MAX_IFACES).collect();
        let e = plan(&[i("a", 10, 1)], &[i("a", 10, 1), i("z", 99, 2)], &taken).expect_err("full");
        assert!(e.contains("no free interface slot left for z"), "{e}");
    }
}
