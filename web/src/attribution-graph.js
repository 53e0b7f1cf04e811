// Attribution graph for `attribution_graph`: the pruned graph's most influential nodes laid out by layer (rows:
// tokens at the bottom, logits on top) × token position (columns), links coloured by sign with width ∝ |weight|
// relative to the strongest link into the same target. Hover a node for its activation and influence; click a
// feature to pin it (its links stay highlighted and it is listed below); a slider for the pruning threshold shows
// the nodes whose cumulative influence is within it; "Zero the pinned features" asks the host to call
// `graph_intervene` and shows the graph's predicted logit changes next to the measured ones.
import { connect, el, enableTooltip, fmt, svg, tokenLabel } from "./common.js";

let toolArguments = {};
const session = connect("attribution graph", { input: (args) => (toolArguments = args), result: render });
enableTooltip();

const COLOURS = { feature: "#f4a259", error: "#9e9e9e", token: "#8ab6d6", logit: "#7bc47f" };
const pinned = new Map();

function render(result) {
  if (!Array.isArray(result.nodes) || !Array.isArray(result.links)) throw new Error("no `nodes` / `links` in this result");
  const app = document.getElementById("app");
  const slider = el("input", { type: "range", min: 0.05, max: 1, step: 0.01, value: result.node_threshold, id: "threshold" });
  const shownLabel = el("strong", { id: "threshold-value" });
  const holder = el("div", { class: "scroll", id: "graph" });
  const pinList = el("div", { id: "pinned" });
  const zero = el("button", { id: "zero", disabled: true }, "Zero the pinned features (graph_intervene)");
  const status = el("p", { class: "status", id: "status" });
  const detail = el("div", { id: "detail" });
  const update = () => {
    const threshold = Number(slider.value);
    const nodes = result.nodes.filter((n) => n.kind === "token" || n.kind === "logit" || n.cumulative <= threshold);
    shownLabel.textContent = `${threshold.toFixed(2)} (${nodes.filter((n) => n.kind === "feature").length} features, ${nodes.filter((n) => n.kind === "error").length} errors shown)`;
    holder.replaceChildren(drawGraph(result, nodes, () => showPins(pinList, zero)));
    showPins(pinList, zero);
  };
  slider.addEventListener("input", update);
  zero.addEventListener("click", () => intervene(result, status, detail));
  const c = result.counts;
  app.replaceChildren(
    el("h1", {}, `Attribution graph: ${result.targets.map((t) => `${tokenLabel(t.token)} (p=${t.probability.toFixed(3)})`).join(", ")}`),
    el(
      "p",
      { class: "meta" },
      `replacement score ${result.replacement_score.toFixed(3)} · completeness ${result.completeness_score.toFixed(3)} · ` +
        `${c.feature_nodes_kept} of ${c.features_in_graph} features, ${c.error_nodes_kept} errors, ${c.edges_kept} edges kept (showing the top ${result.nodes.length} nodes)`,
    ),
    el("p", {}, "pruning threshold (cumulative influence) = ", shownLabel, " ", slider),
    el("p", { class: "legend" }, "Orange: features, grey: error nodes, blue: tokens, green: logits; area ∝ influence. Red links raise their target, blue lower it. Click a feature to pin it."),
    holder,
    pinList,
    el("p", {}, zero),
    status,
    detail,
  );
  update();
}

// Columns are token positions, each as wide as its busiest (layer, position) cell needs (nodes side by side),
// so the last position, where most features of a next-token prediction sit, is not a pile.
function place(result, nodes) {
  const nLayers = result.transcoders.n_layers;
  const cells = new Map();
  for (const node of nodes) {
    const row = node.kind === "token" ? -1 : node.kind === "logit" ? nLayers : node.layer;
    const key = `${row}:${node.position}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push({ node, row });
  }
  const spacing = 15;
  const widths = result.tokens.map(() => 56);
  for (const members of cells.values()) {
    const p = members[0].node.position;
    widths[p] = Math.max(widths[p], members.length * spacing + 16);
  }
  const starts = [];
  let x = 48;
  for (const w of widths) {
    starts.push(x);
    x += w;
  }
  const yStep = 26;
  const height = (nLayers + 2) * yStep + 30;
  const places = new Map();
  for (const members of cells.values()) {
    members.sort((a, b) => b.node.influence - a.node.influence);
    members.forEach(({ node, row }, i) => {
      const centre = starts[node.position] + widths[node.position] / 2;
      places.set(node.node_id, { x: centre + (i - (members.length - 1) / 2) * spacing, y: height - 20 - (row + 1) * yStep });
    });
  }
  const centres = widths.map((w, p) => starts[p] + w / 2);
  return { places, width: x + 16, height, centres, yStep, nLayers };
}

function tipOf(result, node) {
  const token = tokenLabel(node.label);
  if (node.kind === "feature") {
    return `L${node.layer} feature ${node.feature} at ${token} (position ${node.position})\nactivation ${node.activation.toFixed(3)}\ninfluence ${node.influence.toFixed(4)} (cumulative ${node.cumulative.toFixed(3)})`;
  }
  if (node.kind === "error") return `error node L${node.layer} at ${token} (position ${node.position})\ninfluence ${node.influence.toFixed(4)} (cumulative ${node.cumulative.toFixed(3)})`;
  if (node.kind === "token") return `token ${token} (position ${node.position})\ninfluence ${node.influence.toFixed(4)}`;
  const target = result.targets.find((t) => t.token === node.label);
  return `logit ${token}${target ? `\np = ${target.probability.toFixed(4)}` : ""}`;
}

function drawGraph(result, nodes, onPin) {
  const { places, width, height, centres, yStep, nLayers } = place(result, nodes);
  const shown = new Set(nodes.map((n) => n.node_id));
  const links = result.links.filter((l) => shown.has(l.source) && shown.has(l.target));
  const strongest = new Map();
  for (const l of links) strongest.set(l.target, Math.max(strongest.get(l.target) || 0, Math.abs(l.weight)));
  const axis = [];
  result.tokens.forEach((token, p) => axis.push(svg("text", { x: centres[p], y: height - 4, "text-anchor": "middle" }, document.createTextNode(tokenLabel(token)))));
  for (let layer = 0; layer < nLayers; layer += Math.max(1, Math.ceil(nLayers / 12))) {
    axis.push(svg("text", { x: 4, y: height - 20 - (layer + 1) * yStep + 3 }, document.createTextNode(`L${layer}`)));
  }
  axis.push(svg("text", { x: 4, y: height - 20 + 3 }, document.createTextNode("emb")));
  axis.push(svg("text", { x: 4, y: height - 20 - (nLayers + 1) * yStep + 3 }, document.createTextNode("logit")));
  const lines = links.map((l) => {
    const a = places.get(l.source);
    const b = places.get(l.target);
    const share = Math.abs(l.weight) / (strongest.get(l.target) || 1);
    const lit = pinned.has(l.source) || pinned.has(l.target);
    const d = `M ${a.x} ${a.y} Q ${(a.x + b.x) / 2 + 0.15 * (b.y - a.y)} ${(a.y + b.y) / 2} ${b.x} ${b.y}`;
    return svg(
      "g",
      { "data-edge": `${l.source}->${l.target}`, "data-tip": `${l.source} → ${l.target}\nweight ${fmt(l.weight)}` },
      svg("path", { d, fill: "none", stroke: "transparent", "stroke-width": 8, class: "hit" }),
      svg("path", {
        d,
        fill: "none",
        stroke: l.weight >= 0 ? "rgb(178, 24, 43)" : "rgb(33, 102, 172)",
        "stroke-width": (0.5 + 3.5 * share).toFixed(2),
        "stroke-opacity": lit ? 0.95 : 0.25 + 0.45 * share,
        class: lit ? "edge lit" : "edge",
      }),
    );
  });
  const top = Math.max(...nodes.map((n) => n.influence), 1e-12);
  const circles = nodes.map((node) => {
    const { x, y } = places.get(node.node_id);
    const r = 3 + 4 * Math.sqrt(node.influence / top);
    const isFeature = node.kind === "feature";
    const group = svg(
      "g",
      { "data-node": node.node_id, "data-tip": tipOf(result, node), tabindex: isFeature ? 0 : undefined, role: isFeature ? "button" : undefined, style: isFeature ? "cursor: pointer" : undefined },
      svg("circle", { cx: x, cy: y, r, fill: COLOURS[node.kind], stroke: pinned.has(node.node_id) ? "var(--accent)" : "var(--color-text-primary)", "stroke-width": pinned.has(node.node_id) ? 3 : 0.7 }),
    );
    if (isFeature) {
      group.addEventListener("click", () => {
        if (pinned.has(node.node_id)) pinned.delete(node.node_id);
        else pinned.set(node.node_id, node);
        document.getElementById("threshold").dispatchEvent(new Event("input"));
        onPin();
      });
    }
    return group;
  });
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" }, ...axis, ...lines, ...circles);
}

function showPins(list, button) {
  const nodes = [...pinned.values()];
  button.disabled = nodes.length === 0 || typeof toolArguments.prompt !== "string";
  list.replaceChildren(
    nodes.length
      ? el("p", {}, "Pinned: ", ...nodes.map((n) => el("span", { class: "pin", "data-pin": n.node_id }, `L${n.layer} f${n.feature} at ${tokenLabel(n.label)} (activation ${n.activation.toFixed(3)}) `)))
      : el("p", { class: "status" }, "No feature pinned."),
  );
}

async function intervene(result, status, detail) {
  const features = [...pinned.values()].map((n) => ({ layer: n.layer, position: n.position, feature: n.feature, value: 0 }));
  const args = { prompt: toolArguments.prompt, transcoders: toolArguments.transcoders, features, targets: result.targets.map((t) => t.token) };
  status.textContent = `Calling graph_intervene on ${features.length} feature(s)…`;
  try {
    const reply = await session.callTool("graph_intervene", args);
    if (reply.isError || !reply.structuredContent) throw new Error((reply.content || []).map((b) => b.text || "").join(" ") || "no result");
    const out = reply.structuredContent;
    status.textContent = `Zeroed ${features.length} feature(s); attention ${out.freeze_attention ? "frozen" : "live"} in the replacement and model runs.`;
    const rows = out.targets.map((t) =>
      el("tr", { "data-target": t.token }, el("th", {}, tokenLabel(t.token)), el("td", {}, fmt(t.predicted_direct)), el("td", {}, fmt(t.direct)), el("td", {}, fmt(t.replacement)), el("td", {}, fmt(t.model))),
    );
    detail.replaceChildren(
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "logit"), el("th", {}, "graph predicts"), el("th", {}, "direct (frozen)"), el("th", {}, "replacement"), el("th", {}, "model"))), el("tbody", {}, ...rows)),
    );
  } catch (error) {
    status.textContent = `graph_intervene failed: ${error.message}`;
  }
}
