// Logit lens (`logit_lens`): one row per layer, the top-k tokens with probabilities; the target highlighted
// wherever it appears, and its rank per layer.
import { connect, el, enableTooltip, tokenLabel } from "./common.js";

connect("logit lens", { result: render });
enableTooltip();

function render(result) {
  const app = document.getElementById("app");
  const k = Math.max(...result.layers.map((l) => l.top.length));
  const head = el("tr", {}, el("th", {}, "layer"), el("th", {}, "target rank"), el("th", {}, "P(target)"));
  for (let i = 0; i < k; i++) head.append(el("th", {}, `#${i + 1}`));
  const body = result.layers.map((layer) => {
    const row = el(
      "tr",
      { class: layer.layer === result.first_top1_layer ? "first-top1" : undefined, "data-layer": layer.layer },
      el("th", {}, layer.layer),
      el("td", { "data-cell": `rank-${layer.layer}`, "data-tip": `${tokenLabel(result.target)} after layer ${layer.layer}: rank ${layer.target_rank} (0 = top-1), P = ${layer.target_prob.toFixed(4)}` }, String(layer.target_rank)),
      el("td", {}, layer.target_prob.toFixed(4)),
    );
    layer.top.forEach((t, i) =>
      row.append(
        el(
          "td",
          {
            class: t.id === result.target_id ? "target" : undefined,
            "data-cell": `${layer.layer}-${i}`,
            "data-tip": `after layer ${layer.layer}: #${i + 1} ${tokenLabel(t.token)} (id ${t.id}), P = ${t.prob.toFixed(4)}`,
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
      `Target ${tokenLabel(result.target)} (highlighted): final P = ${result.final_prob.toFixed(4)}; top-1 from layer ${result.first_top1_layer ?? "never"} on.`,
    ),
    el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body))),
  );
}
