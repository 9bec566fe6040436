// The alerts page's table is one HTML text (a dcc.Markdown, for speed), so its Silence
// buttons are plain HTML: a click sets the page's `alerts-silence-click` store, whose
// callback silences the alert (pages/alerts/page.py).
document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("button.alert-silence");
    if (!button || !window.dash_clientside || !window.dash_clientside.set_props) {
        return;
    }
    button.disabled = true;
    button.textContent = "Silencing…";
    window.dash_clientside.set_props("alerts-silence-click", {
        data: {alert: button.dataset.alertId, at: Date.now()},
    });
});
