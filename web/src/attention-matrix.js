import { el, sequential, tokenLabel } from "./common.js";

/** A query × key attention matrix with token labels; hover a cell for its weight. */
export function attentionMatrix(result) {
  const tokens = result.tokens;
  const n = tokens.length;
  const grid = el("div", { class: "grid", style: { gridTemplateColumns: `120px repeat(${n}, 18px)` } });
  grid.append(el("div"));
  tokens.forEach((token, k) => grid.append(el("div", { class: "label collabel" }, `${tokenLabel(token)}@${k}`)));
  result.pattern.forEach((row, q) => {
    grid.append(el("div", { class: "label" }, `${tokenLabel(tokens[q])}@${q}`));
    for (let k = 0; k < n; k++) {
      const weight = k < row.length ? row[k] : null;
      const masked = k > q;
      grid.append(
        el("div", {
          class: "cell",
          tabindex: masked ? undefined : 0,
          style: { width: "18px", background: masked ? "var(--missing)" : sequential(weight, 1) },
          "data-cell": `q${q}k${k}`,
          "data-tip": masked
            ? `query ${tokenLabel(tokens[q])}@${q} cannot attend to a later key`
            : `query ${tokenLabel(tokens[q])}@${q} → key ${tokenLabel(tokens[k])}@${k}\nweight ${weight.toFixed(4)}`,
        }),
      );
    }
  });
  return el(
    "div",
    {},
    el("p", { class: "legend" }, `L${result.layer}H${result.head} on ${JSON.stringify(result.prompt)}: rows = queries, columns = keys, darker = more attention (0..1).`),
    el("div", { class: "scroll" }, grid),
  );
}
