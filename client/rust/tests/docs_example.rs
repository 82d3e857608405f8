//! docs/rust.md's first example is examples/first.rs, and the block of its "Routing under
//! Citus" section is examples/router.rs; `cargo test` compiles both examples: the page
//! cannot show code that does not build.

/// The first rust block of docs/rust.md at or after `heading`.
fn block_after(heading: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let page =
        std::fs::read_to_string(format!("{}/../../docs/rust.md", root)).expect("docs/rust.md");
    let from = page.find(heading).expect("the heading");
    let start = from + page[from..].find("```rust\n").expect("a rust block") + "```rust\n".len();
    page[start..start + page[start..].find("```\n").expect("the block ends")].to_string()
}

fn example(name: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    std::fs::read_to_string(format!("{}/examples/{}", root, name)).expect("the example")
}

#[test]
fn the_first_example_of_the_docs_is_examples_first_rs() {
    let block = block_after("# Rust client");
    assert_eq!(
        block,
        example("first.rs"),
        "docs/rust.md's first block and examples/first.rs differ"
    );
}

#[test]
fn the_routing_example_of_the_docs_is_examples_router_rs() {
    let block = block_after("## Routing under Citus");
    assert_eq!(
        block,
        example("router.rs"),
        "docs/rust.md's routing block and examples/router.rs differ"
    );
}
