//! The committed JSON Schema is generated from the Rust document types: they cannot drift.

#[test]
fn committed_schema_matches_the_rust_types() {
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/pipeline.schema.json"))
            .expect("schema is JSON");
    let generated = scarab::pipeline::doc::json_schema();
    assert_eq!(
        committed, generated,
        "schema/pipeline.schema.json is stale: regenerate it with `scarab schema > schema/pipeline.schema.json`"
    );
}

#[test]
fn every_example_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let parsed = scarab::pipeline::parse(&text, scarab::pipeline::Format::Yaml);
        assert!(parsed.is_ok(), "{}: {:?}", path.display(), parsed.err());
        count += 1;
    }
    assert!(count >= 4, "examples/ holds the four documented pipelines");
}

/// The shell completions and the man page the .deb installs are generated from the CLI's
/// clap definitions and committed: they cannot drift from the binary.
#[test]
fn committed_completions_and_man_page_match_the_cli() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/generated");
    for (args, file) in [
        (&["completions", "bash"][..], "scarab.bash"),
        (&["completions", "zsh"][..], "_scarab"),
        (&["completions", "fish"][..], "scarab.fish"),
        (&["man"][..], "scarab.1"),
    ] {
        let output = std::process::Command::new(crate::common::BIN)
            .args(args)
            .output()
            .expect("scarab");
        assert!(output.status.success(), "scarab {args:?}");
        let committed = std::fs::read(dir.join(file)).expect("committed file");
        assert!(
            committed == output.stdout,
            "packaging/generated/{file} is stale: regenerate it with `scarab {}`",
            args.join(" ")
        );
    }
}
