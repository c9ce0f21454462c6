//! Compiles every `bpf/*.bpf.c` (and `bpf/bench/*.bpf.c`) into a libbpf-rs
//! skeleton, turns `bpf/include/fastpath.h` into Rust types with bindgen, and
//! derives the reason names from the header so Rust never hand-copies them.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..").canonicalize().unwrap();
    let bpf = root.join("bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let clang = env::var("FASTPATH_CLANG").unwrap_or_else(|_| "clang-19".into());
    println!("cargo:rerun-if-env-changed=FASTPATH_CLANG");

    let include = bpf.join("include");
    let lib = bpf.join("lib");
    for dir in [&include, &lib] {
        println!("cargo:rerun-if-changed={}", dir.display());
        for e in fs::read_dir(dir).unwrap() {
            println!("cargo:rerun-if-changed={}", e.unwrap().path().display());
        }
    }

    let mut skels = String::new();
    for dir in [bpf.clone(), bpf.join("bench")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut srcs: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
            .collect();
        srcs.sort();
        for src in srcs {
            println!("cargo:rerun-if-changed={}", src.display());
            let stem = src.file_name().unwrap().to_string_lossy().trim_end_matches(".bpf.c").to_string();
            let skel = out.join(format!("{stem}.skel.rs"));
            SkeletonBuilder::new()
                .source(&src)
                .obj(out.join(format!("{stem}.bpf.o")))
                .clang(&clang)
                .clang_args([
                    "-O2",
                    "-g",
                    "-Wall",
                    "-Werror",
                    // v3 (ALU32, JMP32; kernels >= 5.1): clang-19 still defaults to v1.
                    "-mcpu=v3",
                    "-D__TARGET_ARCH_x86",
                    &format!("-I{}", include.display()),
                    &format!("-I{}", lib.display()),
                ])
                .build_and_generate(&skel)
                .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
            skels.push_str(&format!(
                "pub mod {stem} {{ include!(concat!(env!(\"OUT_DIR\"), \"/{stem}.skel.rs\")); }}\n"
            ));
        }
    }
    fs::write(out.join("skels.rs"), skels).unwrap();

    let header = include.join("fastpath.h");
    bindgen::Builder::default()
        .header_contents("wrapper.h", &format!("#include <linux/types.h>\n#include \"{}\"\n", header.display()))
        .allowlist_type("fp_.*")
        .allowlist_var("FP_.*")
        .rustified_enum("fp_reason")
        .rustified_enum("fp_route_type")
        .derive_default(true)
        .derive_eq(true)
        .generate()
        .expect("bindgen fastpath.h")
        .write_to_file(out.join("intf.rs"))
        .unwrap();

    fs::write(out.join("reason_names.rs"), reason_names(&header)).unwrap();
}

/// `FP_R_NOT_IP` -> "not_ip", in enum order, straight from the header.
fn reason_names(header: &Path) -> String {
    let text = fs::read_to_string(header).unwrap();
    let body = text.split("enum fp_reason {").nth(1).expect("enum fp_reason").split("};").next().unwrap();
    let mut names = Vec::new();
    for line in body.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("FP_R_") {
            let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if ident != "_COUNT" {
                names.push(format!("{:?}", ident.to_lowercase()));
            }
        }
    }
    format!("/// Reason names in `enum fp_reason` order.\npub const REASON_NAMES: &[&str] = &[{}];\n", names.join(", "))
}
