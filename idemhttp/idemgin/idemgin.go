// Package idemgin runs idemhttp's middleware in a gin router. It is a module of its own, so that
// idem itself does not depend on gin.
//
//	mw, err := idemhttp.Middleware(pool, &idemhttp.Config{
//		Scope: func(r *http.Request) string { return "user:" + userID(r.Context()) },
//	})
//	if err != nil {
//		return err
//	}
//	router := gin.New()
//	router.POST("/orders", idemgin.Middleware(mw), func(c *gin.Context) {
//		t, _ := idemhttp.Tx(c.Request.Context()) // the transaction that holds the key
//		...
//		c.JSON(http.StatusCreated, order)
//	})
//
// gin's own adapters for net/http middleware (gin.WrapH and the like) do not work here: the
// middleware must see the handler's whole response before anything reaches the client, and
// run the rest of gin's chain inside its transaction. Middleware does both: the handlers after
// it write into the middleware's buffer, through c.Writer, and read its transaction from
// c.Request's context.
package idemgin

import (
	"bufio"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
)

// Middleware returns a gin handler that runs the rest of the chain inside mw, which is meant
// to be the middleware from idemhttp.Middleware (any func(http.Handler) http.Handler works).
// When mw answers by itself (a missing or invalid key, a replay, a conflict), the rest of the
// chain does not run: the gin context is aborted. Put it on the routes it guards, or with
// router.Use before them; put gin's Recovery before it, so that a panic, after the middleware
// has rolled the transaction back, is answered on the real connection.
//
//	router.Use(gin.Recovery(), idemgin.Middleware(mw))
func Middleware(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		outerWriter, outerRequest := c.Writer, c.Request
		defer func() { c.Writer, c.Request = outerWriter, outerRequest }()
		ran := false
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			rw := &responseWriter{ResponseWriter: w, status: http.StatusOK, size: -1}
			c.Writer, c.Request = rw, r
			c.Next()
			// gin writes the header lazily, at the end of the whole chain; the middleware must
			// have it before this function returns.
			rw.WriteHeaderNow()
		})).ServeHTTP(outerWriter, outerRequest)
		if !ran {
			c.Abort()
		}
	}
}

// responseWriter is a gin.ResponseWriter over the writer the middleware hands its handler. As
// gin's own, it keeps the status until the body is written, so that headers set after
// c.Status (gin's renderers set Content-Type then) are part of the response.
type responseWriter struct {
	http.ResponseWriter
	status int
	size   int // -1 until the header is written
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (rw *responseWriter) WriteHeader(code int) {
	if code > 0 && !rw.Written() {
		rw.status = code
	}
}

func (rw *responseWriter) WriteHeaderNow() {
	if !rw.Written() {
		rw.size = 0
		rw.ResponseWriter.WriteHeader(rw.status)
	}
}

func (rw *responseWriter) Write(b []byte) (int, error) {
	rw.WriteHeaderNow()
	n, err := rw.ResponseWriter.Write(b)
	rw.size += n
	return n, err
}

func (rw *responseWriter) WriteString(s string) (int, error) {
	rw.WriteHeaderNow()
	n, err := io.WriteString(rw.ResponseWriter, s)
	rw.size += n
	return n, err
}

func (rw *responseWriter) Status() int   { return rw.status }
func (rw *responseWriter) Size() int     { return rw.size }
func (rw *responseWriter) Written() bool { return rw.size != -1 }

// Flush goes to the middleware, which refuses to stream a guarded response (see
// idemhttp.ErrStreaming).
func (rw *responseWriter) Flush() {
	rw.WriteHeaderNow()
	_ = http.NewResponseController(rw.ResponseWriter).Flush()
}

// Hijack goes to the middleware too, which does not let a guarded handler take the connection.
func (rw *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(rw.ResponseWriter).Hijack()
}

// CloseNotify never fires: gin requires the method, net/http has deprecated it; use the
// request's context.
func (rw *responseWriter) CloseNotify() <-chan bool {
	if cn, ok := rw.ResponseWriter.(interface{ CloseNotify() <-chan bool }); ok {
		return cn.CloseNotify()
	}
	return make(chan bool)
}

func (rw *responseWriter) Pusher() http.Pusher {
	if p, ok := rw.ResponseWriter.(http.Pusher); ok {
		return p
	}
	return nil
}

// Unwrap lets http.ResponseController reach the middleware's writer (for deadlines).
func (rw *responseWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }
