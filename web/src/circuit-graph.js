// Circuit graph for `edge_attribution` and `find_circuit`: components laid out by layer (embeddings left,
// logits right; a head's query input and its key/value group's inputs land on the head / group), edges
// coloured by sign with width ∝ |score|, and a slider for k (the top k edges by |score|) that shows the
// exact faithfulness wherever it was measured at that k.
import { connect, el, enableTooltip, fmt, svg } from "./common.js";

connect("circuit graph", { result: render });
enableTooltip();

const NAME = /^L(\d+)(?:H(\d+)|KV(\d+)|MLP)/;

/** The component a writer or reader belongs to, and its column (2·layer + 1 attention, + 2 MLP). */
function component(name) {
  if (name === "embed") return { id: "embed", column: 0 };
  if (name === "logits") return { id: "logits", column: Infinity };
  const match = NAME.exec(name);
  if (!match) return { id: name, column: 0 };
  const layer = Number(match[1]);
  if (name.includes("MLP")) return { id: `L${layer}MLP`, column: 2 * layer + 2 };
  const id = match[2] !== undefined ? `L${layer}H${match[2]}` : `L${layer}KV${match[3]}`;
  return { id, column: 2 * layer + 1 };
}

function measuredFaithfulness(result) {
  const points = new Map();
  for (const step of result.search || []) if (step.faithfulness !== null) points.set(step.k, step.faithfulness);
  for (const point of result.curve || []) if (point.faithfulness !== null) points.set(point.k, point.faithfulness);
  if (result.faithfulness && result.n_edges !== undefined && result.search) points.set(result.n_edges, result.faithfulness.value);
  return points;
}

function baselineText(baseline) {
  if (!baseline) return "no random-circuit baseline";
  return `random circuits of its size ${fmt(baseline.mean)} (p = ${baseline.p_value.toPrecision(2)})`;
}

function render(result) {
  const app = document.getElementById("app");
  const edges = [...(result.edges || [])].sort((a, b) => Math.abs(b.score) - Math.abs(a.score));
  if (!edges.length) {
    app.replaceChildren(el("p", {}, "No edges in this result (granularity 'node'?): nothing to draw."));
    return;
  }
  const faithfulness = measuredFaithfulness(result);
  const slider = el("input", { type: "range", min: 1, max: edges.length, value: Math.min(edges.length, 50), id: "k" });
  const kLabel = el("strong", { id: "k-value" });
  const faithLabel = el("span", { id: "faithfulness" });
  const holder = el("div", { class: "scroll", id: "graph" });
  const measured = [...faithfulness.entries()].sort((a, b) => a[0] - b[0]);
  const update = () => {
    const k = Number(slider.value);
    kLabel.textContent = String(k);
    faithLabel.textContent = faithfulness.has(k)
      ? `exact faithfulness at k = ${k}: ${faithfulness.get(k).toFixed(3)}`
      : measured.length
        ? "not measured at this k (measured: " + measured.map(([mk, v]) => `k=${mk}: ${v.toFixed(3)}`).join(", ") + ")"
        : "faithfulness not measured: run circuit_faithfulness or find_circuit";
    holder.replaceChildren(drawGraph(edges.slice(0, k)));
  };
  slider.addEventListener("input", update);
  const title = result.search ? `find_circuit: ${result.n_edges} of ${result.total_edges} edges (target ${result.target})` : `edge_attribution (${result.method}): top ${edges.length} of ${result.n_edges} edges`;
  app.replaceChildren(
    el("h1", {}, title),
    el("p", { class: "meta" }, `clean logit diff ${fmt(result.clean_logit_diff.value)}, corrupt ${fmt(result.corrupt_logit_diff.value)}` + (result.search ? ` · faithfulness ${result.faithfulness.value.toFixed(3)}, ${baselineText(result.baseline)}` : " · attribution scores are estimates")
      + (result.search && edges.length < result.n_edges ? ` · showing the top ${edges.length} of the circuit's ${result.n_edges} edges (all of them: ${result.circuit_uri})` : "")),
    el("p", {}, "top k = ", kLabel, " ", slider, " ", faithLabel),
    el("p", { class: "legend" }, "Red edges push toward the clean answer, blue against; width ∝ |score|. Hover an edge or a node."),
    holder,
  );
  update();
}

function drawGraph(edges) {
  const nodes = new Map();
  const place = (name) => {
    const c = component(name);
    if (!nodes.has(c.id)) nodes.set(c.id, { ...c, score: 0, names: new Set() });
    nodes.get(c.id).names.add(name);
    return nodes.get(c.id);
  };
  const drawn = edges.map((e) => ({ ...e, from: place(e.writer), to: place(e.reader) }));
  const finite = [...nodes.values()].map((n) => n.column).filter(Number.isFinite);
  const lastColumn = Math.max(0, ...finite) + 1;
  const columns = new Map();
  for (const node of nodes.values()) {
    if (!Number.isFinite(node.column)) node.column = lastColumn;
    if (!columns.has(node.column)) columns.set(node.column, []);
    columns.get(node.column).push(node);
  }
  const order = [...columns.keys()].sort((a, b) => a - b);
  const xStep = 90;
  const yStep = 26;
  const height = Math.max(...[...columns.values()].map((c) => c.length)) * yStep + 40 + Math.min(160, 0.18 * xStep * order.length);
  order.forEach((column, i) => {
    const members = columns.get(column).sort((a, b) => a.id.localeCompare(b.id, "en", { numeric: true }));
    members.forEach((node, j) => {
      node.x = 50 + i * xStep;
      node.y = height - 16 - (members.length - j) * yStep;
    });
  });
  const width = 100 + (order.length - 1) * xStep;
  const maxScore = Math.max(...edges.map((e) => Math.abs(e.score))) || 1;
  // Each edge is an arc bowing upward with its length, so edges that skip columns do not run through the nodes
  // between; a wide transparent copy under it makes it easy to hover.
  const lines = drawn.map((e, i) => {
    const bend = Math.min(e.from.y, e.to.y) - 10 - 0.18 * Math.abs(e.to.x - e.from.x);
    const d = `M ${e.from.x} ${e.from.y} Q ${(e.from.x + e.to.x) / 2} ${bend} ${e.to.x} ${e.to.y}`;
    return svg(
      "g",
      { "data-edge": `${e.writer}->${e.reader}`, "data-tip": `#${i + 1} ${e.writer} → ${e.reader}\nscore ${fmt(e.score)}`, tabindex: 0 },
      svg("path", { d, fill: "none", stroke: "transparent", "stroke-width": 9, class: "hit" }),
      svg("path", {
        d,
        fill: "none",
        stroke: e.score >= 0 ? "rgb(178, 24, 43)" : "rgb(33, 102, 172)",
        "stroke-width": (0.6 + (5 * Math.abs(e.score)) / maxScore).toFixed(2),
        "stroke-opacity": 0.75,
        class: "edge",
      }),
    );
  });
  const circles = [...nodes.values()].map((node) =>
    svg(
      "g",
      { "data-node": node.id, "data-tip": `${node.id}\nas ${[...node.names].join(", ")}` },
      svg("circle", { cx: node.x, cy: node.y, r: 6, fill: "var(--color-background-primary)", stroke: "var(--color-text-primary)" }),
      svg("text", { x: node.x + 8, y: node.y + 3 }, document.createTextNode(node.id)),
    ),
  );
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" }, ...lines, ...circles);
}
