package soakreport

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// elements parses doc as XML and returns its elements' attributes by
// element name, failing on malformed XML.
func elements(t *testing.T, doc string) map[string][]map[string]string {
	t.Helper()
	out := map[string][]map[string]string{}
	d := xml.NewDecoder(strings.NewReader(doc))
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			attrs := map[string]string{}
			for _, a := range se.Attr {
				attrs[a.Name.Local] = a.Value
			}
			out[se.Name.Local] = append(out[se.Name.Local], attrs)
		}
	}
}

func TestPlotSVG(t *testing.T) {
	p := Plot{
		Title: `RSS <of> "everything" & more`, XLabel: "minutes", YLabel: "MiB", YFromZero: true,
		Series: []Series{
			{Name: "a & b", Points: []Point{{X: 0, Y: 10}, {X: 1, Y: 12}, {X: 2, Y: 11}}},
			// A restart: two lines; a NaN point splits too and is not drawn.
			{Name: "restarted", Points: []Point{{X: 0, Y: 30}, {X: 1, Y: 31}, {X: 1.5, Y: 5, Break: true}, {X: 2, Y: 6}, {X: 2.5, Y: math.NaN()}, {X: 3, Y: 7}}},
		},
		Bands: []Band{{From: 0.5, To: 1.2, Label: "kill etcd"}},
	}
	doc := p.SVG()
	els := elements(t, doc)
	if n := len(els["polyline"]); n != 3 {
		t.Errorf("%d polylines, want 3 (one line, and a restarted one in two)", n)
	}
	if n := len(els["circle"]); n != 1 {
		t.Errorf("%d single points, want 1 (the point after NaN)", n)
	}
	if !strings.Contains(doc, "RSS &lt;of&gt; &quot;everything&quot; &amp; more") || !strings.Contains(doc, ">a &amp; b<") {
		t.Error("title or series name not escaped")
	}
	w, h := 1200.0, 520.0
	for _, pl := range els["polyline"] {
		for _, xy := range strings.Fields(pl["points"]) {
			xs, ys, _ := strings.Cut(xy, ",")
			x, _ := strconv.ParseFloat(xs, 64)
			y, _ := strconv.ParseFloat(ys, 64)
			if x < plotLeft || x > w-plotRight || y < plotTop || y > h-plotBottom {
				t.Errorf("point %s outside the plot area", xy)
			}
		}
	}
	// The band (a rect besides the background and the frame) and its label.
	if n := len(els["rect"]); n != 3 {
		t.Errorf("%d rects, want background, band and frame", n)
	}
	if !strings.Contains(doc, ">kill etcd<") {
		t.Error("band label missing")
	}
	// The Y axis starts at 0 and has round ticks.
	if !strings.Contains(doc, `text-anchor="end">0<`) || !strings.Contains(doc, `text-anchor="end">30<`) {
		t.Errorf("Y ticks: want 0 and 30 among them")
	}
}

func TestPlotEmptyAndFlat(t *testing.T) {
	for name, p := range map[string]Plot{
		"empty":        {Title: "nothing"},
		"single point": {Series: []Series{{Name: "x", Points: []Point{{X: 5, Y: 5}}}}},
		"flat":         {Series: []Series{{Name: "x", Points: []Point{{X: 0, Y: 3}, {X: 1, Y: 3}}}}},
		"all NaN":      {Series: []Series{{Name: "x", Points: []Point{{X: math.NaN(), Y: 1}}}}},
		"many series": {Series: func() []Series {
			var s []Series
			for i := range 12 {
				s = append(s, Series{Name: fmt.Sprint(i), Points: []Point{{X: 0, Y: float64(i)}, {X: 1, Y: float64(i)}}})
			}
			return s
		}()},
	} {
		t.Run(name, func(t *testing.T) {
			doc := p.SVG()
			elements(t, doc)
			if strings.Contains(doc, "NaN") || strings.Contains(doc, "Inf") {
				t.Errorf("NaN or Inf in the document:\n%s", doc)
			}
		})
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 10, 5, []float64{0, 2, 4, 6, 8, 10}},
		{0, 1, 10, []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}},
		{3, 97, 8, []float64{20, 40, 60, 80}},
		{0, 31.5, 8, []float64{0, 5, 10, 15, 20, 25, 30}},
		{-3, 3, 6, []float64{-3, -2, -1, 0, 1, 2, 3}},
	} {
		got := ticks(tc.lo, tc.hi, tc.n)
		if !slices.Equal(got, tc.want) {
			t.Errorf("ticks(%v, %v, %d) = %v, want %v", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
}

func TestRSSPlot(t *testing.T) {
	start := at(0)
	samples := []Sample{
		{T: at(0), Component: "vk", RSS: 10 << 20}, {T: at(60), Component: "vk", RSS: 11 << 20},
		{T: at(120), Component: "vk", Gen: 1, RSS: 5 << 20}, {T: at(180), Component: "vk", Gen: 1, RSS: 6 << 20},
		{T: at(0), Component: "etcd", RSS: 40 << 20}, {T: at(180), Component: "etcd", RSS: 41 << 20},
	}
	p := RSSPlot("rss", samples, start, []Window{{Kind: "kill sandman-vk", Start: at(100), End: at(130)}})
	if len(p.Series) != 2 || p.Series[0].Name != "etcd" || p.Series[1].Name != "vk" {
		t.Fatalf("series %+v", p.Series)
	}
	if segs := segments(p.Series[1].Points); len(segs) != 2 {
		t.Errorf("the restarted vk draws %d lines, want 2", len(segs))
	}
	if len(p.Bands) != 1 || math.Abs(p.Bands[0].From-100.0/60) > 1e-9 || math.Abs(p.Bands[0].To-130.0/60) > 1e-9 {
		t.Errorf("bands %+v", p.Bands)
	}
}
