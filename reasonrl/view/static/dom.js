// reasonrl view: the DOM helper both pages' scripts use (view.js, prompt.js), loaded before them.
// el("div", {class: "x"}, child, ...) makes an element ("svg:path" one in the SVG namespace); attributes that are
// undefined, null or false are left out; children are nodes or text (arrays are flattened).
window.reasonrlView = {
  el: function el(tag, attrs, ...children) {
    const node = tag.startsWith("svg:") ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    }
    return node;
  },
};
