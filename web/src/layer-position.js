// Layer × position map for `patch`: one row per layer (per layer·head for heads_by_pos), one column per token,
// diverging colours centred at 0; hover a cell for its score, patched value and tokens.
import { connect, diverging, el, enableTooltip, fmt, legend, spanOf, tokenLabel } from "./common.js";

const session = connect("layer × position map", { result: draw });
enableTooltip();

// patch returns its score grid to 3 decimals (or, when it would not fit, only its top cells); the complete result
// (result://) holds the grids at full precision with the patched values, read here whenever there is one.
async function draw(result) {
  render(result.result_uri && result.component !== "mlp_neurons" ? await session.complete(result) : result);
}

function render(result) {
  const app = document.getElementById("app");
  const tokens = result.tokens || [];
  const skipped = new Set(result.skipped_positions || []);
  let rows = [];
  if (Array.isArray(result.scores)) {
    rows = result.scores.map((row, layer) => ({ name: `L${layer}`, layer, values: row, patched: result.patched?.[layer] }));
  } else if (Array.isArray(result.head_scores)) {
    result.head_scores.forEach((heads, layer) =>
      heads.forEach((row, head) =>
        rows.push({ name: `L${layer}H${head}`, layer, values: row, patched: result.head_patched?.[layer]?.[head] }),
      ),
    );
  } else {
    app.replaceChildren(el("p", {}, "This component has no layer × position grid; see the result's `cells`."));
    return;
  }
  const span = spanOf(rows.map((r) => r.values));
  const grid = el("div", { class: "grid", style: { gridTemplateColumns: `64px repeat(${tokens.length}, 26px)` } });
  grid.append(el("div"));
  for (const t of tokens) {
    const text = t.clean_token === t.corrupt_token ? tokenLabel(t.clean_token) : `${tokenLabel(t.clean_token)}/${tokenLabel(t.corrupt_token)}`;
    grid.append(el("div", { class: "label collabel", title: text }, `${text}@${t.position}`));
  }
  for (const row of rows) {
    grid.append(el("div", { class: "label" }, row.name));
    tokens.forEach((t, position) => {
      const value = row.values[position] ?? null;
      const patched = row.patched?.[position];
      const lines = [
        `${row.name}, token ${tokenLabel(t.clean_token)} (position ${position})`,
        skipped.has(position) ? "before the first difference: identical runs, score 0 (not run)" : `score ${fmt(value)}`,
      ];
      if (patched !== undefined && patched !== null) lines.push(`patched ${result.metric} ${fmt(patched)}`);
      if (t.clean_token !== t.corrupt_token) lines.push(`clean ${tokenLabel(t.clean_token)} / corrupt ${tokenLabel(t.corrupt_token)}`);
      grid.append(
        el("div", {
          class: "cell",
          tabindex: 0,
          style: { background: diverging(value, span) },
          "data-cell": `${row.name}P${position}`,
          "data-tip": lines.join("\n"),
        }),
      );
    });
  }
  const what = result.direction === "noise" ? "destroyed" : "recovered";
  app.replaceChildren(
    el("h1", {}, `patch ${result.component} (${result.method}, ${result.direction}, ${result.metric})`),
    el("p", { class: "meta" }, `clean ${fmt(result.clean.value)}, corrupt ${fmt(result.corrupt.value)}${result.approximate ? " · attribution: a first-order estimate" : " · exact"}`),
    legend(`Each cell: the ${what} fraction of the clean−corrupt gap; red > 0, blue < 0, scale ±${span.toFixed(3)}. Columns are tokens (clean/corrupt where they differ).`),
    el("div", { class: "scroll" }, grid),
  );
}
