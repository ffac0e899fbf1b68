package org.atlas.analysis;

import java.io.IOException;
import java.util.Arrays;

import org.apache.lucene.analysis.CharArraySet;
import org.apache.lucene.analysis.TokenFilter;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.analysis.tokenattributes.PositionIncrementAttribute;

/**
 * Drops a token whose term was already seen: in the whole stream by default, or only among
 * the tokens at the same position when {@code onlyOnSamePosition} (the {@code unique}
 * filter's {@code only_on_same_position} setting).
 */
final class UniqueTokenFilter extends TokenFilter {

    private final CharTermAttribute term = addAttribute(CharTermAttribute.class);
    private final PositionIncrementAttribute position = addAttribute(PositionIncrementAttribute.class);
    private final CharArraySet seen = new CharArraySet(8, false);
    private final boolean onlyOnSamePosition;

    UniqueTokenFilter(TokenStream input, boolean onlyOnSamePosition) {
        super(input);
        this.onlyOnSamePosition = onlyOnSamePosition;
    }

    @Override
    public boolean incrementToken() throws IOException {
        while (input.incrementToken()) {
            if (onlyOnSamePosition && position.getPositionIncrement() > 0) {
                seen.clear();
            }
            if (!seen.contains(term.buffer(), 0, term.length())) {
                // CharArraySet keeps the array it is given, and the term buffer is reused: copy it.
                seen.add(Arrays.copyOf(term.buffer(), term.length()));
                return true;
            }
        }
        return false;
    }

    @Override
    public void reset() throws IOException {
        super.reset();
        seen.clear();
    }
}
