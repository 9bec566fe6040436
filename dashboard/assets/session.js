// When the dashboard's key stops working (revoked, or the cookie expired), the live updates of
// an open page are refused with 401 and the page would keep showing its last data without a
// word. Dash's callbacks go through window.fetch: on such a 401, go to the login page, which
// comes back here after a new login.
(function () {
  const fetchFirst = window.fetch.bind(window);
  let leaving = false;
  window.fetch = async function (resource, init) {
    const response = await fetchFirst(resource, init);
    const url = typeof resource === "string" ? resource : resource && resource.url;
    if (response.status === 401 && !leaving && String(url).includes("/_dash-")) {
      leaving = true;
      const here = window.location.pathname + window.location.search;
      window.location.assign("/dashboard/login?next=" + encodeURIComponent(here) + "&expired=1");
    }
    return response;
  };
})();
