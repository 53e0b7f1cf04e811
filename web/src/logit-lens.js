// Logit lens (`logit_lens`): one row per layer, the top-k tokens with probabilities; the target highlighted
// wherever it appears, and its rank per layer.
import { connect, el, enableTooltip, tokenLabel } from "./common.js";

connect("logit lens", { result: render });
enableTooltip();

// Rows carry integer layers: -1 is the embedding (site "embed"), k the output of block k.
const label = (layer) => (layer === -1 ? "embed" : String(layer));

function render(result) {
  const app = document.getElementById("app");
  const k = Math.max(...result.layers.map((l) => l.top.length));
  const head = el("tr", {}, el("th", {}, "layer"), el("th", {}, "target rank"), el("th", {}, "P(target)"));
  for (let i = 0; i < k; i++) head.append(el("th", {}, `#${i + 1}`));
  const body = result.layers.map((layer) => {
    const name = label(layer.layer);
    const row = el(
      "tr",
      { class: layer.layer === result.first_top1_layer ? "first-top1" : undefined, "data-layer": name },
      el("th", {}, name),
      el("td", { "data-cell": `rank-${name}`, "data-tip": `${tokenLabel(result.target)} after layer ${name}: rank ${layer.target_rank} (0 = top-1), P = ${layer.target_prob.toFixed(4)}` }, String(layer.target_rank)),
      el("td", {}, layer.target_prob.toFixed(4)),
    );
    layer.top.forEach((t, i) =>
      row.append(
        el(
          "td",
          {
            class: t.id === result.target_id ? "target" : undefined,
            "data-cell": `${name}-${i}`,
            "data-tip": `after layer ${name}: #${i + 1} ${tokenLabel(t.token)} (id ${t.id}), P = ${t.prob.toFixed(4)}`,
          },
          `${tokenLabel(t.token)} ${t.prob.toFixed(3)}`,
        ),
      ),
    );
    return row;
  });
  app.replaceChildren(
    el("h1", {}, `Logit lens: ${JSON.stringify(result.prompt)}`),
    el(
      "p",
      { class: "meta" },
      `Target ${tokenLabel(result.target)} (highlighted): final P = ${result.final_prob.toFixed(4)}; ${result.first_top1_layer === null ? "never top-1 to the end" : `top-1 from layer ${label(result.first_top1_layer)} on`}.`,
    ),
    el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body))),
  );
}
