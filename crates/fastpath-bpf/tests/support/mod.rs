//! Shared pieces of the BPF_PROG_RUN tests: a private network namespace with
//! real devices, packet builders, the table contents ("world") and the runner.

pub mod conntrack;
pub mod cpu;
pub mod ct_icmp;
pub mod netns;
pub mod packet;
pub mod runner;
pub mod world;
