//! A run's DAG as an SVG drawn on the server: steps in columns by depth (a step sits one
//! column right of the deepest step it needs), edges from each need to its step, each
//! node coloured by its state (a CSS class: no inline style, as the page's policy wants)
//! and linked to its section of the page.

use std::fmt::Write;

use serde_json::Value;

use super::pages::esc;

const NODE_W: usize = 180;
const NODE_H: usize = 40;
const GAP_X: usize = 60;
const GAP_Y: usize = 16;
const PAD: usize = 8;
/// Characters of a step's name shown in its node (the whole name is its tooltip).
const LABEL_MAX: usize = 22;

pub fn svg(steps: &[Value], base: &str) -> String {
    let names: Vec<&str> = steps
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default())
        .collect();
    let needs: Vec<Vec<usize>> = steps
        .iter()
        .map(|s| {
            s["needs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .filter_map(|n| names.iter().position(|m| *m == n))
                .collect()
        })
        .collect();
    // Depth: steps come in an order where needs precede (the pipeline is validated to be
    // a DAG), but do not rely on it: iterate to a fixed point, bounded by the step count.
    let mut depth = vec![0usize; steps.len()];
    for _ in 0..steps.len() {
        let mut changed = false;
        for (i, needs) in needs.iter().enumerate() {
            let d = needs.iter().map(|&n| depth[n] + 1).max().unwrap_or(0);
            if d > depth[i] && d < steps.len() {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut row = vec![0usize; steps.len()];
    let mut per_column: Vec<usize> = Vec::new();
    for (i, &d) in depth.iter().enumerate() {
        if per_column.len() <= d {
            per_column.resize(d + 1, 0);
        }
        row[i] = per_column[d];
        per_column[d] += 1;
    }
    let columns = per_column.len().max(1);
    let rows = per_column.iter().copied().max().unwrap_or(1).max(1);
    let width = PAD * 2 + columns * NODE_W + (columns - 1) * GAP_X;
    let height = PAD * 2 + rows * NODE_H + (rows - 1) * GAP_Y;
    let at = |i: usize| {
        (
            PAD + depth[i] * (NODE_W + GAP_X),
            PAD + row[i] * (NODE_H + GAP_Y),
        )
    };
    let mut out = format!(
        "<svg class=\"dag\" id=\"dag\" role=\"img\" aria-label=\"the run's steps and their needs\" \
         viewBox=\"0 0 {width} {height}\" width=\"{width}\" height=\"{height}\" xmlns=\"http://www.w3.org/2000/svg\">"
    );
    for (i, needs) in needs.iter().enumerate() {
        let (x, y) = at(i);
        for &n in needs {
            let (nx, ny) = at(n);
            let (x1, y1) = (nx + NODE_W, ny + NODE_H / 2);
            let (x2, y2) = (x, y + NODE_H / 2);
            let mid = (x1 + x2) / 2;
            let _ = write!(
                out,
                "<path class=\"edge\" d=\"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}\"/>"
            );
        }
    }
    for (i, step) in steps.iter().enumerate() {
        let (x, y) = at(i);
        let name = names[i];
        let state = step["state"].as_str().unwrap_or_default();
        let class: String = state
            .chars()
            .filter(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let label: String = if name.chars().count() > LABEL_MAX {
            name.chars().take(LABEL_MAX - 1).chain(['…']).collect()
        } else {
            name.to_string()
        };
        let attempts = step["attempts"].as_array().map_or(0, Vec::len);
        let _ = write!(
            out,
            "<a href=\"{base}#step-{anchor}\" class=\"node st-{class}\" data-step=\"{anchor}\">\
             <title>{title}: {state_text}</title>\
             <rect x=\"{x}\" y=\"{y}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"6\"/>\
             <text x=\"{tx}\" y=\"{ty}\">{label}</text>\
             <text class=\"sub\" x=\"{tx}\" y=\"{sy}\">{state_text}{tries}</text></a>",
            base = esc(base),
            anchor = esc(name),
            title = esc(name),
            state_text = esc(&state.replace('_', " ")),
            tx = x + 10,
            ty = y + 17,
            sy = y + 32,
            label = esc(&label),
            tries = if attempts > 1 {
                format!(" · {attempts} attempts")
            } else {
                String::new()
            },
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diamond_takes_three_columns_and_every_need_is_an_edge() {
        let steps: Vec<Value> = serde_json::from_str(
            r#"[{"name":"a","state":"succeeded","needs":[]},
                {"name":"b","state":"running","needs":["a"]},
                {"name":"c<x>","state":"failed","needs":["a"]},
                {"name":"d","state":"pending","needs":["b","c<x>"]}]"#,
        )
        .unwrap();
        let svg = svg(&steps, "/ui/runs/r1");
        assert_eq!(svg.matches("class=\"edge\"").count(), 4, "{svg}");
        assert_eq!(svg.matches("<rect").count(), 4);
        let width = PAD * 2 + 3 * NODE_W + 2 * GAP_X;
        assert!(svg.contains(&format!("width=\"{width}\"")), "{svg}");
        assert!(svg.contains("c&lt;x&gt;") && !svg.contains("c<x>"), "{svg}");
        assert!(svg.contains("class=\"node st-failed\""), "{svg}");
    }
}
